#include "slicesched/experiments/overhead.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "overhead_internal.h"
#include "slicesched/common/json.h"
#include "slicesched/common/option_checks.h"
#include "slicesched/common/stats.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

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

using executor::LlamaWeights;
using executor::Tensor;
using overhead_internal::CurrentTid;
using overhead_internal::DirectPrefill;
using overhead_internal::DirectThread;
using overhead_internal::ReadThreadSched;
using overhead_internal::ScheduledRig;
using overhead_internal::ThreadCpuSeconds;

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
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

// The options as the timed runs read them.
struct RunSettings {
  absl::Duration tail_spin;
  bool fcfs = false;        // --priorities fcfs
  bool abba = false;        // --order abba
  bool cuda = false;        // --device cuda
  bool run_direct = false;  // the direct loop is timed (not --only scheduled)
  bool run_sched = false;   // the scheduled path is timed (not --only direct)
  size_t block = 0;         // prefills per block
};

RunSettings SettingsOf(const OverheadOptions& o) {
  RunSettings s;
  s.tail_spin = absl::Microseconds(o.tail_spin_us);
  s.fcfs = o.priorities == "fcfs";
  s.abba = o.order == "abba";
  s.cuda = o.device == "cuda";
  s.run_direct = o.only != "scheduled";
  s.run_sched = o.only != "direct";
  s.block = static_cast<size_t>(std::min<int64_t>(o.block, o.prefills));
  return s;
}

// The two paths and what they run: the scheduled rig, the direct loop's
// weights and threads, the prompts, and the tokens each path sampled.
// Members are in the order they are made, which their destruction reverses.
struct Paths {
  std::unique_ptr<ScheduledRig> rig;
  std::shared_ptr<const LlamaWeights> direct_w;  // where the direct loop's operators run
  std::vector<Tensor> prompts;
  std::vector<int64_t> direct_tokens, sched_tokens;
  std::unique_ptr<DirectThread> direct_thread;  // null: this thread (OverheadOptions::direct_on_main)
  std::unique_ptr<DirectThread> twin_thread;    // the null check's second path, or null
};

// A direct loop's thread, pinned like the device thread.
std::unique_ptr<DirectThread> MakeDirectThread(bool cache, bool cuda, int device_cpu) {
  auto t = std::make_unique<DirectThread>(cache, cuda);
  if (device_cpu >= 0) {
    t->Run([&] {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(device_cpu, &set);
      (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    });
  }
  return t;
}

// The scheduled rig, the direct loop's weights, the prompts and the direct
// loop's threads.
absl::Status MakePaths(const OverheadOptions& o, const RunSettings& s, const CpuPlan& cpus, const LlamaDims& dims,
                       const std::shared_ptr<const LlamaWeights>& w, Paths* p) {
  SLICESCHED_ASSIGN_OR_RETURN(p->rig, ScheduledRig::Create(dims, w, cpus.device_cpu(), absl::Microseconds(o.nap_us),
                                                           s.cuda));
  // The direct loop's weights: where its operators run.
  p->direct_w = w;
  if (s.cuda) {
    SLICESCHED_ASSIGN_OR_RETURN(p->direct_w, w->OnDevice(executor::TensorDevice::Cuda(0)));
  }

  // Context length 1: one prompt token per prefill, built up front.
  p->prompts.reserve(static_cast<size_t>(o.prefills));
  for (int64_t i = 0; i < o.prefills; ++i) {
    const std::vector<int64_t> tok = {(i * 7919 + 13) % dims.vocab};
    p->prompts.push_back(Tensor::FromInt64(tok, {1, 1}));
  }
  p->direct_tokens.resize(p->prompts.size());
  p->sched_tokens.resize(p->prompts.size());

  // The direct loop runs on a thread of its own (DirectThread), pinned like
  // the device thread; `o.direct_on_main` keeps it on this thread (the
  // previous harness).
  if (o.direct_on_main && o.direct_cache) executor::UseCachingCpuAllocatorOnThisThread();
  if (o.direct_on_main && s.cuda) {
    SLICESCHED_RETURN_IF_ERROR(executor::BindThisThreadToCuda(0));
  }
  if (!o.direct_on_main) {
    p->direct_thread = MakeDirectThread(o.direct_cache, s.cuda, cpus.device_cpu());
    SLICESCHED_RETURN_IF_ERROR(p->direct_thread->bound());
  }
  // The null check's second path: the direct loop on a twin thread.
  if (o.null_check) p->twin_thread = MakeDirectThread(o.direct_cache, s.cuda, cpus.device_cpu());
  return absl::OkStatus();
}

// What RunDirectLoop measured.
struct DirectTimes {
  double wall_s = 0, cpu_s = 0;
  ThreadSched sched;
};

// Runs prompts [b, b + n) (index modulo the prompt count) through the direct
// loop, storing the tokens when `tokens`; `ts`: times the loop.
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
absl::Status RunDirectLoop(const Paths& p, const CpuPlan& cpus, DirectThread* thread, size_t b, size_t n,
                           std::vector<int64_t>* tokens, DirectTimes* ts) {
  absl::Status st;
  const pid_t tid = thread != nullptr ? thread->tid() : CurrentTid();
  const ThreadSched s0 = ts != nullptr ? ReadThreadSched(tid) : ThreadSched{};
  std::chrono::steady_clock::time_point t0, t1;
  auto loop = [&] {
    const double cpu0 = ThreadCpuSeconds(CLOCK_THREAD_CPUTIME_ID);
    for (size_t i = b; i < b + n; ++i) {
      const size_t k = i % p.prompts.size();
      absl::StatusOr<int64_t> t = DirectPrefill(*p.direct_w, p.prompts[k]);
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
    cpus.PinThisThread(true);
    t0 = std::chrono::steady_clock::now();
    loop();
    cpus.PinThisThread(false);
  }
  if (st.ok() && ts != nullptr) {
    ts->wall_s += Seconds(t1 - t0);
    ts->sched = Plus(ts->sched, Minus(ReadThreadSched(tid), s0));
  }
  return st;
}

// Untimed runs of both paths (and the twin) first. With one path timed,
// the other one's tokens then come from one untimed run.
absl::Status WarmUp(const OverheadOptions& o, const RunSettings& s, const CpuPlan& cpus, Paths& p) {
  cpus.PinThisThread(false);
  const auto warmup = static_cast<size_t>(std::max(o.warmup, 0));
  SLICESCHED_RETURN_IF_ERROR(RunDirectLoop(p, cpus, p.direct_thread.get(), 0, warmup, nullptr, nullptr));
  if (p.twin_thread != nullptr) {
    SLICESCHED_RETURN_IF_ERROR(RunDirectLoop(p, cpus, p.twin_thread.get(), 0, warmup, nullptr, nullptr));
  }
  if (o.warmup > 0) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(o.warmup, o.prefills));
    SLICESCHED_RETURN_IF_ERROR(p.rig->RunPrefills(std::span<const Tensor>(p.prompts).first(n), o.window, o.wake_batch,
                                                  s.fcfs, s.tail_spin, std::span<int64_t>(p.sched_tokens).first(n)));
  }
  SLICESCHED_RETURN_IF_ERROR(p.rig->Settle());

  if (!s.run_direct) {
    SLICESCHED_RETURN_IF_ERROR(
        RunDirectLoop(p, cpus, p.direct_thread.get(), 0, p.prompts.size(), &p.direct_tokens, nullptr));
  }
  if (!s.run_sched) {
    SLICESCHED_RETURN_IF_ERROR(
        p.rig->RunPrefills(p.prompts, o.window, o.wake_batch, s.fcfs, s.tail_spin, p.sched_tokens));
    SLICESCHED_RETURN_IF_ERROR(p.rig->Settle());
  }
  return absl::OkStatus();
}

// One repetition's totals over its blocks: wall time per path, CPU time and
// scheduler counters per thread.
struct RepetitionTotals {
  double direct_s = 0, sched_s = 0, direct_c = 0, dev_c = 0, master_c = 0;
  ThreadSched direct_t, dev_t, master_t;
};

// The block's prompts [b, b + n) through the direct loop on `thread`: its
// time goes to `block_s`, its CPU and scheduler counts are added to `cpu`
// and `sched`.
absl::Status DirectLoopBlock(const Paths& p, const CpuPlan& cpus, DirectThread* thread, size_t b, size_t n,
                             std::vector<int64_t>* tokens, double& block_s, double& cpu, ThreadSched& sched) {
  DirectTimes ts;
  SLICESCHED_RETURN_IF_ERROR(RunDirectLoop(p, cpus, thread, b, n, tokens, &ts));
  block_s = ts.wall_s;
  cpu += ts.cpu_s;
  sched = Plus(sched, ts.sched);
  return absl::OkStatus();
}

// The block's prompts [b, b + n) through the scheduled path (the null
// check: through the twin in its place); its time goes to `block_s`.
absl::Status ScheduledBlock(const OverheadOptions& o, const RunSettings& s, const CpuPlan& cpus, Paths& p, size_t b,
                            size_t n, pid_t main_tid, double& block_s, RepetitionTotals& t) {
  if (p.twin_thread != nullptr) {
    return DirectLoopBlock(p, cpus, p.twin_thread.get(), b, n, &p.sched_tokens, block_s, t.dev_c, t.dev_t);
  }
  ScheduledRig& rig = *p.rig;
  const ThreadSched m0 = ReadThreadSched(main_tid), d0 = rig.DeviceSched();
  const double dev0 = rig.DeviceCpuSeconds();
  const double cpu0 = ThreadCpuSeconds(CLOCK_THREAD_CPUTIME_ID);
  const auto t0 = std::chrono::steady_clock::now();
  SLICESCHED_RETURN_IF_ERROR(rig.RunPrefills(std::span<const Tensor>(p.prompts).subspan(b, n), o.window,
                                             o.wake_batch, s.fcfs, s.tail_spin,
                                             std::span<int64_t>(p.sched_tokens).subspan(b, n)));
  block_s = Seconds(std::chrono::steady_clock::now() - t0);
  t.master_c += ThreadCpuSeconds(CLOCK_THREAD_CPUTIME_ID) - cpu0;
  t.dev_c += rig.DeviceCpuSeconds() - dev0;
  t.master_t = Plus(t.master_t, Minus(ReadThreadSched(main_tid), m0));
  t.dev_t = Plus(t.dev_t, Minus(rig.DeviceSched(), d0));
  return rig.Settle();
}

// One timed repetition: every block through both paths, a block pair at a
// time; its totals go to `per_rep` and `r`.
absl::Status RunRepetition(const OverheadOptions& o, const RunSettings& s, const CpuPlan& cpus, Paths& p, int rep,
                           pid_t main_tid, PerRepetition& per_rep, OverheadResult* r) {
  RepetitionTotals t;
  const size_t block = s.block;
  for (size_t b = 0; b < p.prompts.size(); b += block) {
    const size_t n = std::min(block, p.prompts.size() - b);
    double direct_block_s = 0, sched_block_s = 0;
    auto direct_block = [&]() -> absl::Status {
      return DirectLoopBlock(p, cpus, p.direct_thread.get(), b, n, &p.direct_tokens, direct_block_s, t.direct_c,
                             t.direct_t);
    };
    // "abba": every other pair runs its scheduled block first (the order
    // flips from block to block and from repetition to repetition), so a
    // drift of the machine's speed, or whatever one path leaves behind for
    // the path run after it, weighs on both paths alike.
    const bool direct_first = !s.abba || ((b / block) + static_cast<size_t>(rep)) % 2 == 0;
    if (direct_first && s.run_direct) {
      SLICESCHED_RETURN_IF_ERROR(direct_block());
    }
    if (s.run_sched) {
      SLICESCHED_RETURN_IF_ERROR(ScheduledBlock(o, s, cpus, p, b, n, main_tid, sched_block_s, t));
    }
    if (!direct_first && s.run_direct) {
      SLICESCHED_RETURN_IF_ERROR(direct_block());
    }
    t.direct_s += direct_block_s;
    t.sched_s += sched_block_s;
    if (s.run_direct && s.run_sched && direct_block_s > 0) {
      r->block_ratios.push_back(sched_block_s / direct_block_s);
      per_rep.block_extra_us_per_op.push_back(1e6 * (sched_block_s - direct_block_s) /
                                              static_cast<double>(n * static_cast<size_t>(r->ops_per_prefill)));
    }
  }
  r->direct_runs_s.push_back(t.direct_s);
  r->scheduled_runs_s.push_back(t.sched_s);
  per_rep.direct_cpu.push_back(t.direct_c);
  per_rep.dev_cpu.push_back(t.dev_c);
  per_rep.master_cpu.push_back(t.master_c);
  per_rep.direct_sched.push_back(t.direct_t);
  per_rep.dev_sched.push_back(t.dev_t);
  per_rep.master_sched.push_back(t.master_t);
  r->tokens_match = r->tokens_match && p.direct_tokens == p.sched_tokens;
  return absl::OkStatus();
}

// What the scheduled path's executors counted, how it placed, and how the
// threads were pinned.
void ReportPaths(const OverheadOptions& o, const RunSettings& s, const CpuPlan& cpus, const Paths& p,
                 OverheadResult* r) {
  ScheduledRig& rig = *p.rig;
  const executor::CpuCacheStats cache = rig.DeviceCache();
  r->device_cache_hits = cache.hits;
  r->device_cache_misses = cache.misses;
  r->scheduled_ops = rig.executors().completed_ops();
  r->fast_path_ops = rig.executors().fast_path_ops();
  r->owner_wakes = rig.executors().owner_wakes();
  const std::string device_kind = s.cuda ? "1 CUDA device" : "1 CPU device";
  r->placement = o.null_check ? "none: the null check times the direct loop against its twin (no scheduler)"
                 : rig.whatif_runs() == 0
                     ? StrCat("SliceScheduler, ", device_kind, ": one candidate (partition single), no what-if runs")
                     : StrCat("SliceScheduler, ", device_kind, ", ", rig.whatif_runs(), " what-if runs");
  r->pinning = cpus.Describe(o.null_check, o.pin);
}

}  // namespace

absl::StatusOr<OverheadResult> RunOverhead(const OverheadOptions& o) {
  SLICESCHED_RETURN_IF_ERROR(o.Validate());
  const RunSettings s = SettingsOf(o);
  if (s.cuda) {
    SLICESCHED_RETURN_IF_ERROR(Annotate(executor::CheckCudaDevice(0), "--device cuda"));
  }
  SLICESCHED_ASSIGN_OR_RETURN(LlamaDims dims, LlamaPreset(o.model));
  // The direct path gets the same single core as an executor's device thread.
  executor::SetIntraOpThreadsForThisThread(1);
  SLICESCHED_ASSIGN_OR_RETURN(std::shared_ptr<const LlamaWeights> w,
                              LlamaWeights::FromSeed(dims, o.seed));
  const CpuPlan cpus(o.pin);
  Paths p;
  SLICESCHED_RETURN_IF_ERROR(MakePaths(o, s, cpus, dims, w, &p));
  SLICESCHED_RETURN_IF_ERROR(WarmUp(o, s, cpus, p));

  OverheadResult r;
  ReportOptions(o, &r);
  r.tokens_match = true;
  const pid_t main_tid = CurrentTid();
  PerRepetition per_rep;
  r.ops_per_prefill = std::max(p.rig->prefill_ops(), 1);
  for (int rep = 0; rep < o.repetitions; ++rep) {
    SLICESCHED_RETURN_IF_ERROR(RunRepetition(o, s, cpus, p, rep, main_tid, per_rep, &r));
  }
  Summarize(std::move(per_rep), &r);
  ReportPaths(o, s, cpus, p, &r);
  if (!r.tokens_match) return TokensDiffer(p.direct_tokens, p.sched_tokens);
  return r;
}

}  // namespace slicesched
