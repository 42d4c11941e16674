// The two paths `slicesim overhead` times: the operators called directly
// (DirectPrefill, on a DirectThread) and the master's path (ScheduledRig);
// and the per-thread counters they are measured with.
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "overhead_internal.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

namespace slicesched::overhead_internal {

using executor::ExecutorOptions;
using executor::ExecutorSet;
using executor::LlamaKernelRunner;
using executor::LlamaRequest;
using executor::LlamaWeights;
using executor::Tensor;

double ThreadCpuSeconds(clockid_t clock) {
  timespec ts{};
  if (clock_gettime(clock, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

pid_t CurrentTid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

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

// ---------------------------------------------------------------------------
// ScheduledRig

absl::StatusOr<std::unique_ptr<ScheduledRig>> ScheduledRig::Create(const LlamaDims& dims,
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

absl::Status ScheduledRig::RunPrefills(std::span<const Tensor> prompts, int window, int wake_batch, bool fcfs,
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

absl::Status ScheduledRig::Settle() {
  SLICESCHED_RETURN_IF_ERROR(exec_->Dispatch(clock_.Now()));
  return g_.VerifyInvariants();
}

double ScheduledRig::DeviceCpuSeconds() {
  absl::MutexLock l(&mu_);
  return device_clock_.has_value() ? ThreadCpuSeconds(*device_clock_) : 0.0;
}

executor::CpuCacheStats ScheduledRig::DeviceCache() {
  absl::MutexLock l(&mu_);
  return device_cache_;
}

ThreadSched ScheduledRig::DeviceSched() {
  pid_t tid;
  {
    absl::MutexLock l(&mu_);
    tid = device_tid_;
  }
  return ReadThreadSched(tid);
}

ScheduledRig::ScheduledRig(AcceleratorSet accel, std::unique_ptr<LlamaKernelRunner> runner)
    : g_(std::move(accel)),
      runner_(std::move(runner)),
      transfer_est_(g_.accelerators()),
      ctx_(&g_.templates(), &op_est_, &transfer_est_) {}

void ScheduledRig::Start(int device_cpu, absl::Duration nap) {
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

}  // namespace slicesched::overhead_internal
