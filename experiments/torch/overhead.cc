#include "slicesched/experiments/overhead.h"

#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "slicesched/common/clock.h"
#include "slicesched/common/json.h"
#include "slicesched/common/option_checks.h"
#include "slicesched/common/stats.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/common/thread_pool.h"
#include "slicesched/estimate/estimators.h"
#include "slicesched/executor/torch/cpu_allocator.h"
#include "slicesched/executor/runtime/executor.h"
#include "slicesched/executor/kernels/llama_kernels.h"
#include "slicesched/executor/llama/llama_ops.h"
#include "slicesched/gmg/gmg.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/sched/slice_scheduler.h"
#include "slicesched/sim/simulator.h"

namespace slicesched {

std::string OverheadResult::ToJson() const {
  auto list = [](const std::vector<double>& v) { return JsonNumberList(v, 4); };
  return absl::StrFormat(
      "{\"prefills\": %d, \"direct_s\": %.4f, \"scheduled_s\": %.4f, \"overhead_pct\": %.2f, "
      "\"repetitions\": %d, \"window\": %d, \"block\": %d, \"nap_us\": %d, \"tail_spin_us\": %d, \"wake_batch\": %d, \"direct_runs_s\": %s, \"scheduled_runs_s\": %s, "
      "\"per_prefill_direct_us\": %.1f, \"per_prefill_scheduled_us\": %.1f, \"tokens_match\": %s, "
      "\"direct_cpu_s\": %.4f, \"device_cpu_s\": %.4f, \"master_cpu_s\": %.4f, "
      "\"scheduled_ops\": %d, \"fast_path_ops\": %d, \"owner_wakes\": %d, "
      "\"only\": \"%s\", \"direct_on\": \"%s\", \"direct_allocator\": \"%s\", \"device_cache\": {\"hits\": %d, \"misses\": %d}, \"priorities\": \"%s\", \"direct_thread\": %s, \"device_thread\": %s, \"master_thread\": %s, "
      "\"paired_overhead_pct\": %.2f, \"paired_quartiles_pct\": [%.2f, %.2f], \"block_pairs\": %d, \"order\": \"%s\", "
      "\"ops_per_prefill\": %d, \"per_op_direct_us\": %.2f, \"paired_overhead_us_per_op\": %.3f, "
      "\"compared\": \"%s\", \"placement\": \"%s\", \"pinning\": \"%s\", \"model\": \"%s\", \"device\": \"%s\"}",
      prefills, direct_s, scheduled_s, overhead_pct, repetitions, window, block, nap_us, tail_spin_us, wake_batch, list(direct_runs_s),
      list(scheduled_runs_s), prefills > 0 ? 1e6 * direct_s / static_cast<double>(prefills) : 0.0,
      prefills > 0 ? 1e6 * scheduled_s / static_cast<double>(prefills) : 0.0,
      tokens_match ? "true" : "false", direct_cpu_s, device_cpu_s, master_cpu_s,
      scheduled_ops, fast_path_ops, owner_wakes, only.empty() ? "both" : only, direct_on_main ? "master thread" : "own thread",
      direct_cache ? "per-thread cache" : "c10 default", device_cache_hits, device_cache_misses, priorities, direct_thread.ToJson(), device_thread.ToJson(), master_thread.ToJson(),
      paired_overhead_pct, paired_q1_pct, paired_q3_pct, block_ratios.size(), order, ops_per_prefill,
      per_op_direct_us(), paired_overhead_us_per_op, null_check ? "direct twin (null check)" : "scheduled",
      placement, pinning, model, device);
}

std::string ThreadSched::ToJson() const {
  return absl::StrFormat(
      "{\"run_s\": %.4f, \"rq_wait_s\": %.4f, \"sys_s\": %.2f, \"voluntary\": %d, \"involuntary\": %d, "
      "\"minor_faults\": %d, \"migrations\": %d}",
      run_s, rq_wait_s, sys_s, voluntary, involuntary, minor_faults, migrations);
}

namespace {

using executor::LlamaKernelRunner;
using executor::ExecutorOptions;
using executor::ExecutorSet;
using executor::HostTransferBackend;
using executor::LlamaRequest;
using executor::LlamaWeights;
using executor::Tensor;

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// CPU time of a thread (CLOCK_THREAD_CPUTIME_ID: the caller), in seconds.
double ThreadCpuSeconds(clockid_t clock) {
  timespec ts{};
  if (clock_gettime(clock, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

pid_t CurrentTid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// The cumulative scheduler counters of thread `tid` of this process (zeros
// where a file is missing). Reads /proc: call it outside timed regions.
ThreadSched ReadThreadSched(pid_t tid) {
  ThreadSched t;
  if (tid <= 0) return t;
  const std::string dir = StrCat("/proc/self/task/", tid, "/");
  {
    std::ifstream f(dir + "schedstat");
    double run_ns = 0, wait_ns = 0;
    if (f >> run_ns >> wait_ns) {
      t.run_s = 1e-9 * run_ns;
      t.rq_wait_s = 1e-9 * wait_ns;
    }
  }
  {
    std::ifstream f(dir + "status");
    std::string line;
    while (std::getline(f, line)) {
      long long v = 0;
      if (std::sscanf(line.c_str(), "voluntary_ctxt_switches: %lld", &v) == 1) t.voluntary = v;
      if (std::sscanf(line.c_str(), "nonvoluntary_ctxt_switches: %lld", &v) == 1) t.involuntary = v;
    }
  }
  {
    std::ifstream f(dir + "stat");
    std::string line;
    std::getline(f, line);
    // Fields after "(comm) ": state ppid pgrp session tty tpgid flags minflt
    // cminflt majflt cmajflt utime stime.
    if (const size_t close = line.rfind(')'); close != std::string::npos) {
      char state = 0;
      long long skip = 0, minflt = 0, stime = 0;
      unsigned long long flags = 0;
      if (std::sscanf(line.c_str() + close + 1, " %c %lld %lld %lld %lld %lld %llu %lld %lld %lld %lld %lld %lld",
                      &state, &skip, &skip, &skip, &skip, &skip, &flags, &minflt, &skip, &skip, &skip, &skip,
                      &stime) == 13) {
        t.minor_faults = minflt;
        t.sys_s = static_cast<double>(stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
      }
    }
  }
  {
    std::ifstream f(dir + "sched");
    std::string line;
    while (std::getline(f, line)) {
      long long v = 0;
      if (std::sscanf(line.c_str(), "se.nr_migrations : %lld", &v) == 1) t.migrations = v;
    }
  }
  return t;
}

ThreadSched Minus(const ThreadSched& a, const ThreadSched& b) {
  return ThreadSched{a.run_s - b.run_s,           a.rq_wait_s - b.rq_wait_s,
                     a.sys_s - b.sys_s,           a.voluntary - b.voluntary,
                     a.involuntary - b.involuntary, a.minor_faults - b.minor_faults,
                     a.migrations - b.migrations};
}

ThreadSched Plus(const ThreadSched& a, const ThreadSched& b) {
  return ThreadSched{a.run_s + b.run_s,           a.rq_wait_s + b.rq_wait_s,
                     a.sys_s + b.sys_s,           a.voluntary + b.voluntary,
                     a.involuntary + b.involuntary, a.minor_faults + b.minor_faults,
                     a.migrations + b.migrations};
}

// Field-wise medians.
ThreadSched MedianSched(const std::vector<ThreadSched>& v) {
  auto med = [&](auto field) {
    std::vector<double> x;
    for (const ThreadSched& t : v) x.push_back(static_cast<double>(t.*field));
    return Median(std::move(x));
  };
  ThreadSched m;
  m.run_s = med(&ThreadSched::run_s);
  m.rq_wait_s = med(&ThreadSched::rq_wait_s);
  m.sys_s = med(&ThreadSched::sys_s);
  m.voluntary = static_cast<int64_t>(med(&ThreadSched::voluntary));
  m.involuntary = static_cast<int64_t>(med(&ThreadSched::involuntary));
  m.minor_faults = static_cast<int64_t>(med(&ThreadSched::minor_faults));
  m.migrations = static_cast<int64_t>(med(&ThreadSched::migrations));
  return m;
}

// (a) The operators called directly. Returns the sampled token.
absl::StatusOr<int64_t> DirectPrefill(const LlamaWeights& w, const Tensor& tokens) {
  SLICESCHED_ASSIGN_OR_RETURN(Tensor x, executor::Embedding(w, tokens));
  for (int64_t g = 0; g < w.num_groups(); ++g) {
    executor::KvCache cache;  // the prefill's KV cache (dropped at once here)
    SLICESCHED_ASSIGN_OR_RETURN(x, executor::FusedLayers(w, g, x, &cache, 0));
  }
  SLICESCHED_ASSIGN_OR_RETURN(Tensor logits, executor::LmHead(w, x));
  SLICESCHED_ASSIGN_OR_RETURN(Tensor t, executor::Sample(logits, executor::SamplingParams{}));
  const std::vector<int64_t> v = t.ToInt64();
  if (v.size() != 1) return absl::InternalError("direct prefill: no token sampled");
  return v[0];
}

// A thread of its own for the direct loop, so that the two paths run their
// operators alike: each on a thread that does nothing else (the executor's
// device thread; this one), with one intra-op thread, glibc's per-thread
// arena and thread cache, and the same pinning. (On the master's thread the
// direct loop would use the main arena, the thread that also instantiates
// and frees everything else.) Run() executes `f` there and returns when it
// is done (on a ThreadPool of one worker); the caller and `f` take the
// block's time (see run_direct_loop in RunOverhead).
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
                                                              std::shared_ptr<const LlamaWeights> w,
                                                              int device_cpu, absl::Duration nap, bool cuda) {
    std::vector<DeviceSpec> devs(1);
    devs[0].name = cuda ? "gpu0" : "cpu0";
    devs[0].type = cuda ? "cuda" : "cpu";
    devs[0].memory = cuda ? Bytes::GiB(16) : Bytes::GiB(4);
    devs[0].backend = cuda ? DeviceBackend::kCuda : DeviceBackend::kCpu;
    devs[0].ordinal = 0;
    SLICESCHED_ASSIGN_OR_RETURN(AcceleratorSet accel,
                                AcceleratorSet::Create(devs, LinkSpec{10e9, Duration::Micros(5)}));
    SLICESCHED_ASSIGN_OR_RETURN(LlamaTemplates t, BuildLlamaTemplates(dims));
    SLICESCHED_ASSIGN_OR_RETURN(std::unique_ptr<LlamaKernelRunner> runner,
                                LlamaKernelRunner::Create(std::move(w), dims));
    if (cuda) {
      const executor::TensorDevice gpu[] = {executor::TensorDevice::Cuda(0)};
      SLICESCHED_RETURN_IF_ERROR(runner->Place(gpu));
    }
    auto rig = std::unique_ptr<ScheduledRig>(new ScheduledRig(std::move(accel), std::move(runner)));
    SLICESCHED_ASSIGN_OR_RETURN(rig->prefill_, rig->g_.RegisterTemplate(t.prefill));
    rig->prefill_ops_ = t.prefill->num_ops();
    for (const OpSpec& op : t.prefill->ops()) {
      if (op.weight_key.empty()) continue;
      SLICESCHED_RETURN_IF_ERROR(rig->g_.LoadWeights(DeviceId(0), op.weight_key, op.weight_bytes));
    }
    rig->Start(device_cpu, nap);
    return rig;
  }

  // Runs one prefill of context length 1 per prompt, start to retirement,
  // keeping up to `window` of them in flight (instantiated and scheduled,
  // their operators queued on the device) so the device always has the next
  // prefill's operators at hand while the master retires the previous ones;
  // window 1 submits each prefill only after the previous one retired.
  // tokens[i] is prompt i's sampled token.
  // fcfs: each prefill ranks below the one submitted before it (see
  // OverheadOptions::priorities); otherwise all rank alike.
  absl::Status RunPrefills(std::span<const Tensor> prompts, int window, int wake_batch, bool fcfs,
                           absl::Duration tail_spin, std::span<int64_t> tokens) {
    std::fill(tokens.begin(), tokens.end(), -1);
    size_t next = 0, retired = 0, in_flight = 0;
    while (retired < prompts.size()) {
      bool submitted = false;
      // At an idle device, the first prefill is scheduled (and its operators
      // handed over) before the rest of the window is instantiated.
      const bool first_alone = in_flight == 0 && window > 1;
      for (int pass = first_alone ? 0 : 1; pass < 2; ++pass) {
        const size_t fill = pass == 0 ? 1 : static_cast<size_t>(window);
        while (in_flight < fill && next < prompts.size()) {
          spec_.bindings = {{"B", 1}, {"S", 1}};
          spec_.arrival = clock_.Now();
          // First come, first served: a lower priority for every later
          // prefill (the queue discipline runs higher priorities first).
          spec_.priority = fcfs ? -static_cast<int32_t>(submitted_++ % (int64_t{1} << 31)) : 0;
          SLICESCHED_ASSIGN_OR_RETURN(InstanceId id, g_.Instantiate(spec_));
          runner_->SetRequest(id, LlamaRequest{prompts[next], executor::SamplingParams{}});
          {
            absl::MutexLock l(&mu_);
            slot_.insert_or_assign(id.value(), Slot{next, -1});
          }
          ++next;
          ++in_flight;
          submitted = true;
        }
        if (submitted || !g_.unscheduled_frontier().empty()) {
          SLICESCHED_ASSIGN_OR_RETURN(ScheduleStats st, sched_.Schedule(env_, clock_.Now()));
          whatif_runs_ += st.whatif_runs;
        }
        submitted = false;
      }
      // With nothing left to submit, a batch refills nothing: retire each
      // prefill as it finishes, so that the last one's retirement is all
      // that is left when the device runs dry. The last one's completion
      // is polled for (up to tail_spin), not napped through.
      const bool tail = next == prompts.size();
      const int batch = tail ? 1 : wake_batch;
      const absl::Duration spin = tail && in_flight == 1 ? tail_spin : absl::ZeroDuration();
      if (!exec_->WaitForFinishBatch(absl::Seconds(60), batch, spin)) {
        return absl::DeadlineExceededError("scheduled prefill: no completion within 60 s");
      }
      feedback_.clear();
      SLICESCHED_RETURN_IF_ERROR(exec_->AdvanceTo(clock_.Now(), &feedback_));
      for (const RetiredInstance& r : g_.TakeRetired()) {
        runner_->EraseRequest(r.id);
        for (CheckpointId k : r.produced) SLICESCHED_RETURN_IF_ERROR(g_.ReleaseCheckpoint(k));
        if (r.state != InstanceState::kDone) {
          return absl::InternalError(StrCat("scheduled prefill ", r.id, " ", InstanceStateName(r.state),
                                            ": ", r.failure));
        }
        absl::MutexLock l(&mu_);
        auto it = slot_.find(r.id.value());
        if (it == slot_.end()) {
          return absl::InternalError(StrCat("scheduled prefill: unknown instance ", r.id, " retired"));
        }
        tokens[it->second.prompt] = it->second.token;
        slot_.erase(it);
        --in_flight;
        ++retired;
      }
    }
    return absl::OkStatus();
  }

  // Lets the executors release what the GMG freed (released checkpoints).
  absl::Status Settle() {
    SLICESCHED_RETURN_IF_ERROR(exec_->Dispatch(clock_.Now()));
    return g_.VerifyInvariants();
  }
  int64_t whatif_runs() const { return whatif_runs_; }
  // Operators in one prefill (the template's).
  int prefill_ops() const { return prefill_ops_; }
  const ExecutorSet& executors() const { return *exec_; }
  // CPU time the device thread has used so far (0 before its first sample).
  double DeviceCpuSeconds() {
    absl::MutexLock l(&mu_);
    return device_clock_.has_value() ? ThreadCpuSeconds(*device_clock_) : 0.0;
  }
  // The device thread's tensor cache as of its last sampled token.
  executor::CpuCacheStats DeviceCache() {
    absl::MutexLock l(&mu_);
    return device_cache_;
  }
  // The device thread's scheduler counters (zeros before its first sample).
  ThreadSched DeviceSched() {
    pid_t tid;
    {
      absl::MutexLock l(&mu_);
      tid = device_tid_;
    }
    return ReadThreadSched(tid);
  }

 private:
  ScheduledRig(AcceleratorSet accel, std::unique_ptr<LlamaKernelRunner> runner)
      : g_(std::move(accel)),
        runner_(std::move(runner)),
        transfer_est_(g_.accelerators()),
        ctx_(&g_.templates(), &op_est_, &transfer_est_) {}

  void Start(int device_cpu, absl::Duration nap) {
    runner_->SetTokenSink([this](InstanceId inst, const Tensor& t) {
      const std::vector<int64_t> v = t.ToInt64();
      absl::MutexLock l(&mu_);
      if (!device_clock_.has_value()) {
        // The sink runs on the (only) device thread: remember its CPU clock.
        clockid_t c;
        if (pthread_getcpuclockid(pthread_self(), &c) == 0) device_clock_ = c;
        device_tid_ = CurrentTid();
      }
      if (auto it = slot_.find(inst.value()); it != slot_.end()) it->second.token = v.empty() ? -1 : v[0];
      device_cache_ = executor::CachingCpuAllocatorStatsOfThisThread();
    });
    ExecutorOptions eo;
    eo.device_cpus = {device_cpu};
    eo.owner_nap = nap;
    exec_ = std::make_unique<ExecutorSet>(&g_, &clock_, runner_.get(), &transfers_, eo);
    env_.gmg = &g_;
    env_.backend = exec_.get();
    env_.sim = &ctx_;
    env_.pool = nullptr;
    spec_.template_id = prefill_;
    spec_.priority_class = PriorityClass::kOnline;
  }

  SteadyClock clock_;
  GlobalMappingGraph g_;
  std::unique_ptr<LlamaKernelRunner> runner_;
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
  std::unique_ptr<ExecutorSet> exec_;  // last: stopped first
};

}  // namespace

absl::Status OverheadOptions::Validate() const {
  SLICESCHED_RETURN_IF_ERROR(CheckAtLeast({{"--prefills", 1, prefills},
                                           {"--repetitions", 1, repetitions},
                                           {"--window", 1, window},
                                           {"--block", 1, block},
                                           {"--nap-us", 0, nap_us},
                                           {"--tail-spin-us", 0, tail_spin_us}}));
  if (wake_batch < 1 || wake_batch > window) {
    return OptionOutOfRange("--wake-batch", StrCat("in 1..", window, " (at most --window)"), wake_batch);
  }
  if (priorities != "fcfs" && priorities != "equal") return OptionOutOfRange("--priorities", "fcfs or equal", priorities);
  if (order != "abba" && order != "direct-first") return OptionOutOfRange("--order", "abba or direct-first", order);
  if (only != "" && only != "direct" && only != "scheduled") {
    return OptionOutOfRange("--only", "direct or scheduled", only);
  }
  if (device != "cpu" && device != "cuda") return OptionOutOfRange("--device", "cpu or cuda", device);
  if (null_check && !only.empty()) {
    return absl::InvalidArgumentError(StrCat("--null times the direct loop against its twin; --only ", only,
                                             " times one path (give one of them)"));
  }
  if (null_check && direct_on_main) {
    return absl::InvalidArgumentError(
        "--null runs the direct loop and its twin each on a thread of its own; --direct-on-main contradicts it");
  }
  return absl::OkStatus();
}

namespace {

// Pinning: the direct loop and the device thread on one CPU (the same one,
// the last allowed), the master (the calling thread during the scheduled
// runs) on the others, so its wake-ups do not preempt the device thread (the
// paper's master has its own cores too). Needs two allowed CPUs; the calling
// thread's affinity is restored when the plan goes.
class CpuPlan {
 public:
  explicit CpuPlan(bool pin) {
    CPU_ZERO(&original_);
    CPU_ZERO(&master_set_);
    const bool have_affinity = pthread_getaffinity_np(pthread_self(), sizeof(original_), &original_) == 0;
    if (!pin || !have_affinity || CPU_COUNT(&original_) < 2) return;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &original_)) device_cpu_ = c;
    }
    CPU_OR(&master_set_, &master_set_, &original_);
    CPU_CLR(device_cpu_, &master_set_);
  }
  ~CpuPlan() {
    if (device_cpu_ >= 0) (void)pthread_setaffinity_np(pthread_self(), sizeof(original_), &original_);
  }
  CpuPlan(const CpuPlan&) = delete;
  CpuPlan& operator=(const CpuPlan&) = delete;

  int device_cpu() const { return device_cpu_; }  // -1: not pinned
  // The calling thread onto the device's CPU, or onto the master's.
  void PinThisThread(bool device) const {
    if (device_cpu_ < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (device) {
      CPU_SET(device_cpu_, &set);
    } else {
      set = master_set_;
    }
    (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  }
  // Which CPUs ran what, for the report.
  std::string Describe(bool null_check, bool pin) const {
    if (device_cpu_ < 0) return pin ? "not pinned (fewer than 2 CPUs allowed)" : "not pinned";
    std::string others;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &master_set_)) others += StrCat(others.empty() ? "" : ",", c);
    }
    return StrCat(null_check ? "direct loop and its twin on CPU " : "direct loop and device thread on CPU ",
                  device_cpu_, ", master on CPU ", others);
  }

 private:
  cpu_set_t original_;
  cpu_set_t master_set_;
  int device_cpu_ = -1;
};

// The options a result reports.
void ReportOptions(const OverheadOptions& o, OverheadResult* r) {
  r->prefills = o.prefills;
  r->model = o.model;
  r->device = o.device;
  r->repetitions = o.repetitions;
  r->window = o.window;
  r->block = std::min<int64_t>(o.block, o.prefills);
  r->only = o.only;
  r->nap_us = o.nap_us;
  r->tail_spin_us = o.tail_spin_us;
  r->wake_batch = o.wake_batch;
  r->direct_on_main = o.direct_on_main;
  r->direct_cache = o.direct_cache;
  r->priorities = o.priorities;
  r->order = o.order;
  r->null_check = o.null_check;
}

// What each repetition measured besides its times (in OverheadResult).
struct PerRepetition {
  std::vector<double> direct_cpu, dev_cpu, master_cpu;
  std::vector<ThreadSched> direct_sched, dev_sched, master_sched;
  // Each block pair's extra time per operator (see paired_overhead_us_per_op).
  std::vector<double> block_extra_us_per_op;
};

// The medians over the repetitions, and the paired figures over the blocks.
void Summarize(PerRepetition p, OverheadResult* r) {
  r->direct_thread = MedianSched(p.direct_sched);
  r->device_thread = MedianSched(p.dev_sched);
  r->master_thread = MedianSched(p.master_sched);
  r->direct_cpu_s = Median(p.direct_cpu);
  r->device_cpu_s = Median(p.dev_cpu);
  r->master_cpu_s = Median(p.master_cpu);
  r->direct_s = Median(r->direct_runs_s);
  r->scheduled_s = Median(r->scheduled_runs_s);
  r->overhead_pct =
      r->direct_s > 0 && r->scheduled_s > 0 ? 100.0 * (r->scheduled_s - r->direct_s) / r->direct_s : 0.0;
  if (!r->block_ratios.empty()) {
    r->paired_overhead_pct = 100.0 * (Median(r->block_ratios) - 1.0);
    r->paired_q1_pct = 100.0 * (Quantile(r->block_ratios, 0.25) - 1.0);
    r->paired_q3_pct = 100.0 * (Quantile(r->block_ratios, 0.75) - 1.0);
    r->paired_overhead_us_per_op = Median(std::move(p.block_extra_us_per_op));
  }
}

// The first prompt whose tokens differ, as the error of a run whose paths
// disagree.
absl::Status TokensDiffer(const std::vector<int64_t>& direct, const std::vector<int64_t>& scheduled) {
  size_t i = 0;
  while (i < direct.size() && i < scheduled.size() && direct[i] == scheduled[i]) ++i;
  return absl::InternalError(
      StrCat("overhead: the scheduled prefills sampled other tokens than the direct ones (first at prompt ", i,
             ": direct ", i < direct.size() ? direct[i] : -1, ", scheduled ", i < scheduled.size() ? scheduled[i] : -1,
             ")"));
}

}  // namespace

absl::StatusOr<OverheadResult> RunOverhead(const OverheadOptions& o) {
  SLICESCHED_RETURN_IF_ERROR(o.Validate());
  const absl::Duration tail_spin = absl::Microseconds(o.tail_spin_us);
  const bool fcfs = o.priorities == "fcfs";
  const bool abba = o.order == "abba";
  if (o.device == "cuda") SLICESCHED_RETURN_IF_ERROR(Annotate(executor::CheckCudaDevice(0), "--device cuda"));
  SLICESCHED_ASSIGN_OR_RETURN(LlamaDims dims, LlamaPreset(o.model));
  // The direct path gets the same single core as an executor's device thread.
  executor::SetIntraOpThreadsForThisThread(1);
  SLICESCHED_ASSIGN_OR_RETURN(std::shared_ptr<const LlamaWeights> w,
                              LlamaWeights::FromSeed(dims, o.seed));
  const CpuPlan cpus(o.pin);
  const int device_cpu = cpus.device_cpu();
  auto pin_to = [&](bool device) { cpus.PinThisThread(device); };
  const bool cuda = o.device == "cuda";
  SLICESCHED_ASSIGN_OR_RETURN(std::unique_ptr<ScheduledRig> rig,
                              ScheduledRig::Create(dims, w, device_cpu, absl::Microseconds(o.nap_us), cuda));
  // The direct loop's weights: where its operators run.
  std::shared_ptr<const LlamaWeights> direct_w = w;
  if (cuda) {
    SLICESCHED_ASSIGN_OR_RETURN(direct_w, w->OnDevice(executor::TensorDevice::Cuda(0)));
  }

  // Context length 1: one prompt token per prefill, built up front.
  std::vector<Tensor> prompts;
  prompts.reserve(static_cast<size_t>(o.prefills));
  for (int64_t i = 0; i < o.prefills; ++i) {
    const std::vector<int64_t> tok = {(i * 7919 + 13) % dims.vocab};
    prompts.push_back(Tensor::FromInt64(tok, {1, 1}));
  }
  std::vector<int64_t> direct_tokens(prompts.size()), sched_tokens(prompts.size());

  // The direct loop runs on a thread of its own (DirectThread), pinned like
  // the device thread; `o.direct_on_main` keeps it on this thread (the
  // previous harness). Runs prompts [b, b + n) (index modulo the prompt
  // count), storing the tokens when `tokens`; `ts`: times the loop.
  struct DirectTimes {
    double wall_s = 0, cpu_s = 0;
    ThreadSched sched;
  };
  auto make_direct_thread = [&] {
    auto t = std::make_unique<DirectThread>(o.direct_cache, cuda);
    if (device_cpu >= 0) {
      t->Run([&] {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(device_cpu, &set);
        (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
      });
    }
    return t;
  };
  std::unique_ptr<DirectThread> direct_thread;
  if (o.direct_on_main && o.direct_cache) executor::UseCachingCpuAllocatorOnThisThread();
  if (o.direct_on_main && cuda) SLICESCHED_RETURN_IF_ERROR(executor::BindThisThreadToCuda(0));
  if (!o.direct_on_main) {
    direct_thread = make_direct_thread();
    SLICESCHED_RETURN_IF_ERROR(direct_thread->bound());
  }
  // The null check's second path: the direct loop on a twin thread.
  std::unique_ptr<DirectThread> twin_thread;
  if (o.null_check) twin_thread = make_direct_thread();
  // A block's wall time starts on the calling (master's) thread, before it
  // hands the block to the loop's thread, and ends on that thread after its
  // last prefill: like a scheduled block, which starts before the master
  // instantiates its first prefill (so it includes waking the idle device
  // thread) and ends once the master, polling, has retired the last one.
  // Each block of either path thus pays one wake-up of an idle thread on
  // the pinned CPU. Timed from inside the loop, the direct blocks would pay
  // none and the alternation in blocks would count that wake-up against the
  // scheduled path ten times per 1,000 prefills, where the paper's single
  // run counts it once (docs/results.md). The scheduler counters are read from
  // outside the timed window, as the device thread's are.
  // `thread`: the direct loop's thread or the null check's twin (nullptr:
  // this one, OverheadOptions::direct_on_main); `tokens`: where the sampled
  // tokens go (nullptr: dropped).
  auto run_direct_loop = [&](DirectThread* thread, size_t b, size_t n, std::vector<int64_t>* tokens,
                             DirectTimes* ts) -> absl::Status {
    absl::Status st;
    const pid_t tid = thread != nullptr ? thread->tid() : CurrentTid();
    const ThreadSched s0 = ts != nullptr ? ReadThreadSched(tid) : ThreadSched{};
    std::chrono::steady_clock::time_point t0, t1;
    auto loop = [&] {
      const double cpu0 = ThreadCpuSeconds(CLOCK_THREAD_CPUTIME_ID);
      for (size_t i = b; i < b + n; ++i) {
        const size_t k = i % prompts.size();
        absl::StatusOr<int64_t> t = DirectPrefill(*direct_w, prompts[k]);
        if (!t.ok()) {
          st = t.status();
          return;
        }
        if (tokens != nullptr) (*tokens)[k] = *t;
      }
      t1 = std::chrono::steady_clock::now();
      if (ts != nullptr) ts->cpu_s += ThreadCpuSeconds(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    };
    if (thread != nullptr) {
      t0 = std::chrono::steady_clock::now();
      thread->Run(loop);
    } else {
      pin_to(true);
      t0 = std::chrono::steady_clock::now();
      loop();
      pin_to(false);
    }
    if (st.ok() && ts != nullptr) {
      ts->wall_s += Seconds(t1 - t0);
      ts->sched = Plus(ts->sched, Minus(ReadThreadSched(tid), s0));
    }
    return st;
  };

  pin_to(false);
  const auto warmup = static_cast<size_t>(std::max(o.warmup, 0));
  SLICESCHED_RETURN_IF_ERROR(run_direct_loop(direct_thread.get(), 0, warmup, nullptr, nullptr));
  if (twin_thread != nullptr) SLICESCHED_RETURN_IF_ERROR(run_direct_loop(twin_thread.get(), 0, warmup, nullptr, nullptr));
  if (o.warmup > 0) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(o.warmup, o.prefills));
    SLICESCHED_RETURN_IF_ERROR(rig->RunPrefills(std::span<const Tensor>(prompts).first(n), o.window, o.wake_batch, fcfs, tail_spin,
                                                std::span<int64_t>(sched_tokens).first(n)));
  }
  SLICESCHED_RETURN_IF_ERROR(rig->Settle());

  OverheadResult r;
  ReportOptions(o, &r);
  r.tokens_match = true;
  const bool run_direct = o.only != "scheduled", run_sched = o.only != "direct";
  // With one path timed, the other one's tokens come from one untimed run.
  if (!run_direct) SLICESCHED_RETURN_IF_ERROR(run_direct_loop(direct_thread.get(), 0, prompts.size(), &direct_tokens, nullptr));
  if (!run_sched) {
    SLICESCHED_RETURN_IF_ERROR(rig->RunPrefills(prompts, o.window, o.wake_batch, fcfs, tail_spin, sched_tokens));
    SLICESCHED_RETURN_IF_ERROR(rig->Settle());
  }
  const pid_t main_tid = CurrentTid();
  PerRepetition per_rep;
  const size_t block = static_cast<size_t>(std::min<int64_t>(o.block, o.prefills));
  r.ops_per_prefill = std::max(rig->prefill_ops(), 1);
  for (int rep = 0; rep < o.repetitions; ++rep) {
    double direct_s = 0, sched_s = 0, direct_c = 0, dev_c = 0, master_c = 0;
    ThreadSched direct_t, dev_t, master_t;
    for (size_t b = 0; b < prompts.size(); b += block) {
      const size_t n = std::min(block, prompts.size() - b);
      double direct_block_s = 0, sched_block_s = 0;
      // The block's prompts through the direct loop on `thread`: its time
      // goes to `block_s`, its CPU and scheduler counts are added to `cpu`
      // and `sched`.
      auto direct_loop_block = [&](DirectThread* thread, std::vector<int64_t>* tokens, double& block_s,
                                   double& cpu, ThreadSched& sched) -> absl::Status {
        DirectTimes ts;
        SLICESCHED_RETURN_IF_ERROR(run_direct_loop(thread, b, n, tokens, &ts));
        block_s = ts.wall_s;
        cpu += ts.cpu_s;
        sched = Plus(sched, ts.sched);
        return absl::OkStatus();
      };
      auto direct_block = [&]() -> absl::Status {
        return direct_loop_block(direct_thread.get(), &direct_tokens, direct_block_s, direct_c, direct_t);
      };
      auto sched_block = [&]() -> absl::Status {
        if (twin_thread != nullptr) {  // the null check: the twin in the scheduled path's place
          return direct_loop_block(twin_thread.get(), &sched_tokens, sched_block_s, dev_c, dev_t);
        }
        const ThreadSched m0 = ReadThreadSched(main_tid), d0 = rig->DeviceSched();
        const double dev0 = rig->DeviceCpuSeconds();
        const double cpu0 = ThreadCpuSeconds(CLOCK_THREAD_CPUTIME_ID);
        const auto t0 = std::chrono::steady_clock::now();
        SLICESCHED_RETURN_IF_ERROR(rig->RunPrefills(std::span<const Tensor>(prompts).subspan(b, n), o.window, o.wake_batch, fcfs, tail_spin,
                                                    std::span<int64_t>(sched_tokens).subspan(b, n)));
        sched_block_s = Seconds(std::chrono::steady_clock::now() - t0);
        master_c += ThreadCpuSeconds(CLOCK_THREAD_CPUTIME_ID) - cpu0;
        dev_c += rig->DeviceCpuSeconds() - dev0;
        master_t = Plus(master_t, Minus(ReadThreadSched(main_tid), m0));
        dev_t = Plus(dev_t, Minus(rig->DeviceSched(), d0));
        return rig->Settle();
      };
      // "abba": every other pair runs its scheduled block first (the order
      // flips from block to block and from repetition to repetition), so a
      // drift of the machine's speed, or whatever one path leaves behind for
      // the path run after it, weighs on both paths alike.
      const bool direct_first = !abba || ((b / block) + static_cast<size_t>(rep)) % 2 == 0;
      if (direct_first && run_direct) SLICESCHED_RETURN_IF_ERROR(direct_block());
      if (run_sched) SLICESCHED_RETURN_IF_ERROR(sched_block());
      if (!direct_first && run_direct) SLICESCHED_RETURN_IF_ERROR(direct_block());
      direct_s += direct_block_s;
      sched_s += sched_block_s;
      if (run_direct && run_sched && direct_block_s > 0) {
        r.block_ratios.push_back(sched_block_s / direct_block_s);
        per_rep.block_extra_us_per_op.push_back(1e6 * (sched_block_s - direct_block_s) /
                                        static_cast<double>(n * static_cast<size_t>(r.ops_per_prefill)));
      }
    }
    r.direct_runs_s.push_back(direct_s);
    r.scheduled_runs_s.push_back(sched_s);
    per_rep.direct_cpu.push_back(direct_c);
    per_rep.dev_cpu.push_back(dev_c);
    per_rep.master_cpu.push_back(master_c);
    per_rep.direct_sched.push_back(direct_t);
    per_rep.dev_sched.push_back(dev_t);
    per_rep.master_sched.push_back(master_t);
    r.tokens_match = r.tokens_match && direct_tokens == sched_tokens;
  }
  Summarize(std::move(per_rep), &r);
  const executor::CpuCacheStats cache = rig->DeviceCache();
  r.device_cache_hits = cache.hits;
  r.device_cache_misses = cache.misses;
  r.scheduled_ops = rig->executors().completed_ops();
  r.fast_path_ops = rig->executors().fast_path_ops();
  r.owner_wakes = rig->executors().owner_wakes();
  const std::string device_kind = cuda ? "1 CUDA device" : "1 CPU device";
  r.placement = o.null_check ? "none: the null check times the direct loop against its twin (no scheduler)"
                : rig->whatif_runs() == 0
                    ? StrCat("SliceScheduler, ", device_kind, ": one candidate (partition single), no what-if runs")
                    : StrCat("SliceScheduler, ", device_kind, ", ", rig->whatif_runs(), " what-if runs");
  r.pinning = cpus.Describe(o.null_check, o.pin);
  if (!r.tokens_match) return TokensDiffer(direct_tokens, sched_tokens);
  return r;
}

}  // namespace slicesched
