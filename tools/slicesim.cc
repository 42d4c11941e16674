// slicesim: the offline simulator and experiment driver (`slicesim help`).
//
// Commands live in the slicesched::experiments library; this file only
// parses arguments.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <utility>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "slicesched/experiments/accuracy.h"
#include "slicesched/experiments/bench_sim.h"
#include "slicesched/experiments/gmg_demo.h"
#include "slicesched/experiments/replay.h"
#include "slicesched/experiments/ymir_sim.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/loadgen/load.h"
#include "slicesched/synth/tasks.h"
#ifdef SLICESCHED_HAVE_TORCH_EXECUTORS
#include "slicesched/executor/kernels/llama_serving.h"
#include "slicesched/experiments/fidelity.h"
#include "slicesched/experiments/overhead.h"
#endif
#ifdef SLICESCHED_HAVE_YMIR_T2V
#include "slicesched/experiments/pretrain.h"
#include "slicesched/executor/torch/safetensors.h"
#include "slicesched/experiments/lut_profile.h"
#include "slicesched/experiments/task2vec.h"
#include "slicesched/common/clock.h"
#include "slicesched/common/status.h"
#include "slicesched/common/json.h"
#include "slicesched/common/strings.h"
#include "slicesched/ymir/time_lut.h"
#endif

namespace {

// Exit codes: 0 ok, 1 the command failed while running (an unreadable or
// malformed input file, a failed computation), 2 a usage error (an unknown
// command or option, a missing or bad option value).
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

// Prints a usage error of `command`; returns the exit code.
int UsageError(const std::string& command, const std::string& message) {
  std::fprintf(stderr, "slicesim %s: %s\n", command.c_str(), message.c_str());
  return kExitUsage;
}

// Command-line flags of one command: "--name VALUE" pairs and "--name"
// switches, bound to variables. Parse() checks the syntax of every value
// against its flag's type (an integer, a number, one of the choices, given
// when required) and reports the first bad argument as a usage error naming
// the flag and the value; an int flag never truncates, a seed is never
// negative. Bounds are not checked here: the command's options struct
// checks them (its Validate(), reported through Rejected()), so that the
// library and the command line cannot disagree.
class Flags {
 public:
  explicit Flags(std::string command) : command_(std::move(command)) {}
  Flags& Switch(const char* name, bool* out) { return Add(name, Kind::kSwitch, out); }
  Flags& Text(const char* name, std::string* out) { return Add(name, Kind::kText, out); }
  Flags& Int(const char* name, int64_t* out) { return Add(name, Kind::kInt64, out); }
  // An int variable: values outside int's range are refused, not truncated.
  Flags& Int(const char* name, int* out) { return Add(name, Kind::kInt, out); }
  // A seed: a non-negative integer (the variable is unsigned).
  Flags& Seed(const char* name, uint64_t* out) { return Add(name, Kind::kSeed, out); }
  // A finite number ("nan" and "inf" are refused).
  Flags& Num(const char* name, double* out) { return Add(name, Kind::kNum, out); }
  // A text flag whose value must be one of `allowed` (the default in *out is
  // not checked).
  Flags& Choice(const char* name, std::vector<std::string> allowed, std::string* out) {
    Add(name, Kind::kText, out);
    flags_.back().allowed = std::move(allowed);
    return *this;
  }
  // The last flag added must be given.
  Flags& Required() {
    flags_.back().required = true;
    return *this;
  }

  // Returns 0 on success, else the exit code after printing the problem.
  int Parse(const std::vector<std::string>& args) {
    std::vector<bool> seen(flags_.size(), false);
    for (size_t i = 0; i < args.size(); ++i) {
      size_t k = 0;
      while (k < flags_.size() && args[i] != flags_[k].name) ++k;
      if (k == flags_.size()) return Error("unknown argument '" + args[i] + "'");
      const Flag& f = flags_[k];
      seen[k] = true;
      if (f.kind == Kind::kSwitch) {
        *static_cast<bool*>(f.out) = true;
        continue;
      }
      if (i + 1 >= args.size()) return Error(std::string(f.name) + " needs a value");
      if (std::string why = Store(f, args[++i]); !why.empty()) {
        return Error(std::string(f.name) + " " + why + ", got '" + args[i] + "'");
      }
    }
    for (size_t k = 0; k < flags_.size(); ++k) {
      if (flags_[k].required && !seen[k]) return Error(std::string(flags_[k].name) + " is required");
    }
    return 0;
  }

 private:
  enum class Kind { kSwitch, kText, kInt, kInt64, kSeed, kNum };
  struct Flag {
    const char* name;
    Kind kind;
    void* out;
    std::vector<std::string> allowed;  // Choice: the values accepted
    bool required = false;
  };
  // "a", "a or b", "a, b or c".
  static std::string OneOf(const std::vector<std::string>& values) {
    std::string text;
    for (size_t i = 0; i < values.size(); ++i) {
      if (i > 0) text += i + 1 == values.size() ? " or " : ", ";
      text += values[i];
    }
    return text;
  }
  // Converts and stores `v`; returns "" or what the value must be.
  static std::string Store(const Flag& f, const std::string& v) {
    if (f.kind == Kind::kText) {
      if (!f.allowed.empty() && std::find(f.allowed.begin(), f.allowed.end(), v) == f.allowed.end()) {
        return "must be " + OneOf(f.allowed);
      }
      *static_cast<std::string*>(f.out) = v;
      return "";
    }
    if (f.kind == Kind::kNum) {
      double x = 0;
      if (!absl::SimpleAtod(v, &x) || !std::isfinite(x)) return "needs a number";
      *static_cast<double*>(f.out) = x;
      return "";
    }
    int64_t n = 0;
    if (!absl::SimpleAtoi(v, &n)) return "needs an integer";
    switch (f.kind) {
      case Kind::kInt:
        if (n < std::numeric_limits<int>::min() || n > std::numeric_limits<int>::max()) {
          return absl::StrCat("needs an integer in ", std::numeric_limits<int>::min(), "..",
                              std::numeric_limits<int>::max());
        }
        *static_cast<int*>(f.out) = static_cast<int>(n);
        break;
      case Kind::kInt64: *static_cast<int64_t*>(f.out) = n; break;
      case Kind::kSeed:
        if (n < 0) return "must be at least 0";
        *static_cast<uint64_t*>(f.out) = static_cast<uint64_t>(n);
        break;
      case Kind::kNum:
      case Kind::kSwitch:
      case Kind::kText: break;
    }
    return "";
  }
  Flags& Add(const char* name, Kind kind, void* out) {
    flags_.push_back({name, kind, out, {}, false});
    return *this;
  }
  int Error(const std::string& message) const { return UsageError(command_, message); }
  std::string command_;
  std::vector<Flag> flags_;
};

// Prints a failed command's status; returns the exit code.
int Failed(const char* command, const absl::Status& status) {
  std::fprintf(stderr, "slicesim %s: %s\n", command, std::string(status.message()).c_str());
  return kExitFailed;
}

// Prints what a command's options struct refused (its Validate(), called
// before any work) and returns the exit code: an InvalidArgument is a bad
// option value, named with the value by the library, so a usage error (2);
// anything else a failure (1). Only Validate() results come here: an
// InvalidArgument from a run itself (a malformed trace, an unwritable output
// directory) goes to Failed(), the command line being well formed.
int Rejected(const char* command, const absl::Status& status) {
  if (status.code() != absl::StatusCode::kInvalidArgument) return Failed(command, status);
  std::fprintf(stderr, "slicesim %s: %s\n", command, std::string(status.message()).c_str());
  return kExitUsage;
}

int Usage(FILE* to) {
  std::fprintf(to,
               "usage: slicesim COMMAND [options]\n\n"
               "commands:\n"
               "  gmg [--config FILE]   build a Global Mapping Graph from a slicesim config\n"
               "                        (default: the embedded configs/slicesim.yaml) and\n"
               "                        print what it holds\n"
               "  bench-sim [--devices N] [--ops K] [--repetitions R] [--warmup W] [--seed S] [--json]\n"
               "                        time the simulator on a realistic Llama3-8B snapshot\n"
               "  bench-sim --sweep DIR  the same over 8/64/512 devices x 1k..50k operators\n"
               "  accuracy [--trace FILE] [--minutes M] [--load-scale X] [--seed S] [--json]\n"
               "                        simulator and estimator accuracy against a ground-truth\n"
               "                        cluster replaying a trace (default: built-in Azure-derived model)\n"
               "  replay [--trace FILE] [--policy NAME|all] [--minutes M] [--seed S]\n"
               "         [--load-scale X] [--out DIR]\n"
               "                        the paper's co-location experiment on the virtual cluster\n"
               "  overhead [--model tiny|small] [--prefills N] [--repetitions R] [--window W] [--block B] [--pin|--no-pin] [--direct-on-main] [--direct-allocator cache|default] [--wake-batch K] [--nap-us U] [--tail-spin-us U] [--priorities fcfs|equal] [--order abba|direct-first] [--only direct|scheduled] [--null] [--json]\n"
               "                        scheduled vs direct execution of N context-1 prefills on\n"
               "                        the LibTorch executors (paper Table 1; needs LibTorch)\n"
               "  generate-direct --prompt IDS --max-tokens N [--model NAME] [--weights-seed S]\n"
               "         [--safetensors FILE] [--temperature T] [--top-p P] [--top-k K] [--seed S] [--stop IDS]\n"
               "                        the tokens a Generate request yields, computed by calling the\n"
               "                        LibTorch operators directly (IDS: comma-separated token ids;\n"
               "                        prints JSON; needs LibTorch)\n"
               "  load [--socket PATH | --target URI] [--seconds S] [--trace FILE] [--seed N]\n"
               "       [--streams N] [--offline-streams N] [--token-scale X] [--json]\n"
               "                        drive a running sliced over gRPC: open-loop online arrivals\n"
               "                        (built-in Azure-derived model or a trace) plus offline\n"
               "                        streams, or N closed-loop streams; prints the summary\n"
               "  fidelity [--model tiny|small] [--warmup N] [--calibration N] [--iterations N] [--seed S]\n"
               "           [--drift-smoothing S] [--per-op] [--json]\n"
               "                        simulator-predicted vs measured time per training and serving\n"
               "                        iteration, pp2 on 2 CPU executors (paper Table 2; needs LibTorch)\n"
               "  synth-data --task NAME --out FILE [--seed N] [--examples K] [--sequence-length L]\n"
               "         [--num-classes C]\n"
               "                        write a built-in synthetic task's examples as jsonl (.jsonl)\n"
               "                        or tokens-bin (.bin); --list prints the task names\n"
               "  make-backbone --out FILE [--seed S] [--rounds R] [--steps N] [--json]\n"
               "                        pretrain the tiny backbone on the synthetic language (merged\n"
               "                        LoRA rounds) and write it as safetensors (needs LibTorch)\n"
               "  ymir-estimators [--backbone FILE] [--seed S] [--steps N] [--learning-rate X]\n"
               "         [--warmup-steps W] [--head zero|random] [--spatial-step mean|sum]\n"
               "         [--probe trained|head] [--probe-steps N] [--fisher-examples K]\n"
               "         [--gain steps|area] [--gain-window W]\n"
               "         [--tasks NAME[:CLASSES],...]\n"
               "         [--eval-every N] [--max-steps-factor F]\n"
               "         [--lora-rank R] [--sequence-length L] [--repeats N] [--eval-examples K]\n"
               "         [--iter-prefix-fraction F] [--iter-quadratic] [--stop-loss-epoch-steps N]\n"
               "         [--iter-envelope min|isotonic] [--iter-time-shift on|off] [--iter-half-life H]\n"
               "         [--iter-online on|off] [--iter-plateau-k K] [--iter-plateau-drop D]\n"
               "         [--iter-plateau-span N] [--direction none|asymmetry] [--fit-on FILE,...]\n"
               "         [--pairs-out FILE] [--iter-transfer-watch K] [--iter-transfer-fit time|loss]\n"
               "         [--iter-transfer-prior-points K]\n"
               "         [--label-margin M] [--language-vocab V] [--language-classes K]\n"
               "         [--lora-alpha A] [--train-examples N] [--batch-size B] [--curves-only]\n"
               "         [--similarities-only] [--fisher empirical|model] [--embed lora|lora+head]\n"
               "         [--distance normalised|cosine] [--null-runs N] [--band-k K]\n"
               "         [--gains-out FILE] [--json]  (--steps >= 20, the Task2Vec probe's steps;\n"
               "         --iter-quadratic: fit the b2 term after the warm-up too; a task name\n"
               "         may carry a data salt, NAME@K; --curves-only: the normal runs only;\n"
               "         --iter-online: a plateaued first window is not fitted, the estimate\n"
               "         waits for the drop (ymir::EstimateOnline; off: the fixed prefix);\n"
               "         --fit-on: fit the gain model on training seeds' --pairs-out files\n"
               "         instead of leave-one-out on this run;\n"
               "         --iter-transfer-watch K: refine each transfer estimate after K steps\n"
               "         of the run (ymir::EstimateTransferOnline; default 16, 0 = prior only);\n"
               "         --iter-transfer-fit: the watched speed-up from the matched steps (time,\n"
               "         default) or the losses against the time-scaled normal curve (loss);\n"
               "         --iter-transfer-prior-points K: shrink it toward the predicted gain,\n"
               "         which counts as K watched points (default 4, 0 = none);\n"
               "         --iter-half-life H: the iteration fit weighs the prefix's end, half-life\n"
               "         H steps (default 12, 0 = equal weights);\n"
               "         --similarities-only: the Task2Vec similarity matrix only; pairs with\n"
               "         |gain| < K x RMS of the null runs' gains are neutral, scored apart;\n"
               "         without --backbone the backbone is pretrained on the tasks' language;\n"
               "         the defaults: the graded family with a negative level, see task2vec.h)\n"
               "                        Task2Vec similarity -> transfer gain, against gains measured\n"
               "                        by training the synthetic tasks (Ymir Table 2; needs LibTorch),\n"
               "                        the iteration estimator's errors and the stop-loss\n"
               "  ymir-lut --out FILE [--backbone FILE] [--devices 1,2] [--grad-accum 1,2]\n"
               "         [--batches 4,8,16] [--frozen 0,2] [--amp 0,1] [--ckpt 0,1]\n"
               "         [--parallelism data,pipeline] [--iterations N] [--json]\n"
               "                        profile Ymir's time LUT (seconds per training iteration) on\n"
               "                        this machine's CPU devices; writes it as CSV (needs LibTorch)\n"
               "  ymir [--trace FILE] [--jobs N] [--seed S] [--load 1|2] [--gpus G] [--nodes N]\n"
               "       [--gains FILE] [--policy NAME|all] [--json] [--round S] [--restart S]\n"
               "       [--ilp-window K] [--ilp-gap G] [--ilp-time-limit S] [--ymir-horizon S]\n"
               "       [--lambda X] [--ilp-donors 0|1] [--pair-shares 0|1]\n"
               "       [--gains-definition saved|speedup] [--gains-column gain|gain_steps]\n"
               "                        job-level comparison of the Ymir planner with Tiresias,\n"
               "                        Optimus, Pollux, Themis and SRTF on a GPU-cluster job trace\n"
               "                        (default ../shared/traces/philly_jobs_pollux.csv, 2000 jobs,\n"
               "                        240 GPUs = 60 nodes x 4; gains: a documented stand-in table)\n"
               "  help                  this text\n\n"
               "exit codes: 0 ok, 1 the command failed while running, 2 usage error (unknown\n"
               "command or option, a missing option, a bad option value)\n");
  return to == stdout ? 0 : 2;
}

int Gmg(const std::vector<std::string>& args) {
  std::string config;
  if (int rc = Flags("gmg").Text("--config", &config).Parse(args)) return rc;
  auto c = slicesched::LoadGmgDemoConfig(config);
  if (!c.ok()) return Failed("gmg", c.status());
  auto report = slicesched::RunGmgDemo(*c);
  if (!report.ok()) return Failed("gmg", report.status());
  std::fputs(report->c_str(), stdout);
  return 0;
}

int BenchSim(const std::vector<std::string>& args) {
  slicesched::BenchSimOptions o;
  bool json = false;
  std::string sweep_dir;
  if (int rc = Flags("bench-sim")
                   .Switch("--json", &json)
                   .Text("--sweep", &sweep_dir)
                   .Int("--devices", &o.devices)
                   .Int("--ops", &o.ops)
                   .Int("--repetitions", &o.repetitions)
                   .Int("--warmup", &o.warmup)
                   .Seed("--seed", &o.seed)
                   .Int("--horizon-us", &o.horizon_us)
                   .Parse(args)) {
    return rc;
  }
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("bench-sim", v);
  if (!sweep_dir.empty()) {
    absl::Status st = slicesched::RunBenchSimSweep({8, 64, 512}, {1000, 2000, 5000, 10000, 20000, 50000},
                                                   o.repetitions, sweep_dir);
    if (!st.ok()) return Failed("bench-sim", st);
    std::printf("wrote %s/bench_sim.csv (plot: bench/plots/plot_bench_sim.py %s)\n", sweep_dir.c_str(),
                sweep_dir.c_str());
    return 0;
  }
  auto r = slicesched::RunBenchSim(o);
  if (!r.ok()) return Failed("bench-sim", r.status());
  if (json) {
    std::printf("%s\n", r->ToJson().c_str());
  } else {
    std::printf("devices %d, instances %lld, simulated %lld operators (%lld compute, %lld transfers)\n"
                "snapshot %.1f us, construction %.1f us, simulation %.1f us (median of %d, after %d untimed)\n"
                "%.0f simulated operators per ms, construction included (paper: 176.8)\n",
                r->devices, static_cast<long long>(r->instances), static_cast<long long>(r->ops),
                static_cast<long long>(r->compute_ops), static_cast<long long>(r->transfers), r->snapshot_us,
                r->construct_us, r->simulate_us, r->repetitions, r->warmup, r->ops_per_ms);
  }
  return 0;
}

int Accuracy(const std::vector<std::string>& args) {
  slicesched::AccuracyOptions o;
  bool json = false;
  if (int rc = Flags("accuracy")
                   .Switch("--json", &json)
                   .Text("--trace", &o.trace)
                   .Num("--minutes", &o.minutes)
                   .Num("--load-scale", &o.load_scale)
                   .Num("--warmup", &o.warmup_s)
                   .Num("--predict-every", &o.predict_every_s)
                   .Seed("--seed", &o.seed)
                   .Parse(args)) {
    return rc;
  }
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("accuracy", v);
  auto r = slicesched::RunAccuracy(o);
  if (!r.ok()) return Failed("accuracy", r.status());
  if (json) {
    std::printf("%s\n", r->ToJson().c_str());
  } else {
    std::printf("workload: %s\n%lld requests, %lld instances, %lld operators, %lld transfers over %.0f s\n"
                "completion MAPE %.2f%% (p90 %.2f%%) over %lld predictions (paper: 1.83%%)\n"
                "operator estimator MAPE %.2f%% (paper 0.32%%), transfer estimator MAPE %.2f%% (paper 0.92%%)\n",
                r->workload.c_str(), static_cast<long long>(r->requests), static_cast<long long>(r->instances),
                static_cast<long long>(r->ops), static_cast<long long>(r->transfers), r->simulated_s,
                r->completion_mape_pct, r->completion_p90_ape_pct, static_cast<long long>(r->predictions),
                r->op_mape_pct, r->transfer_mape_pct);
  }
  return 0;
}

int Replay(const std::vector<std::string>& args) {
  slicesched::ReplayOptions o;
  bool no_progress = false;
  std::vector<std::string> policies = slicesched::ReplayPolicyNames();
  policies.push_back("all");
  if (int rc = Flags("replay")
                   .Text("--trace", &o.trace)
                   .Choice("--policy", policies, &o.policy)
                   .Text("--out", &o.out_dir)
                   .Switch("--no-progress", &no_progress)
                   .Num("--minutes", &o.minutes)
                   .Num("--load-scale", &o.load_scale)
                   .Seed("--seed", &o.seed)
                   .Int("--threads", &o.threads)
                   .Parse(args)) {
    return rc;
  }
  o.progress = !no_progress;
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("replay", v);
  auto r = slicesched::RunReplay(o);
  if (!r.ok()) return Failed("replay", r.status());
  std::printf("workload: %s, %.0f minutes, load scale %.3f, seed %llu\n", r->workload.c_str(), o.minutes,
              r->load_scale, static_cast<unsigned long long>(o.seed));
  std::printf("SLO: TTFT <= %.0f ms (Static-Online p90)\n", r->slo_ttft_ms);
  std::printf("%-15s %8s %8s %7s %7s %10s %10s %9s %9s\n", "policy", "req/s", "tok/s", "SLO", "util",
              "ttft p50", "ttft p99", "onl req/s", "off tok/s");
  for (const auto& p : r->policies) {
    std::printf("%-15s %8.3f %8.2f %6.1f%% %6.1f%% %8.0fms %8.0fms %9.3f %9.2f\n", p.policy.c_str(), p.req_per_s,
                p.tok_per_s, 100 * p.slo_attainment, 100 * p.gpu_util, p.ttft_p50_ms, p.ttft_p99_ms,
                p.online_req_per_s, p.offline_tok_per_s);
  }
  std::printf("Static-Online idle slices (10 ms..20 s): p50 %.0f ms, p90 %.0f ms, p99 %.0f ms; "
              "below-p99 share of idle time %.1f%%; utilisation %.1f%%\n",
              r->idle.p50_ms, r->idle.p90_ms, r->idle.p99_ms, 100 * r->idle.share_of_idle_below_p99,
              100 * r->idle.utilization);
  std::printf("idle overlap across the four model instances: pairwise Jaccard %.1f%%, all idle together %.1f%%\n",
              100 * r->overlap.pairwise_jaccard_mean, 100 * r->overlap.all_idle_share);
  for (const auto& p : r->policies) {
    if (p.round_p50_us > 0) {
      std::printf("%s decision latency: p50 %.0f us, p99 %.0f us over rounds with %.1f candidates on average\n",
                  p.policy.c_str(), p.round_p50_us, p.round_p99_us, p.mean_candidates);
    }
  }
  if (!o.out_dir.empty()) {
    const std::string script = std::string(SLICESCHED_SOURCE_DIR) + "/bench/plots/plot_replay.py";
    const std::string cmd = "/usr/bin/python3 '" + script + "' '" + o.out_dir + "' > /dev/null";
    if (std::system(cmd.c_str()) != 0) {
      std::fprintf(stderr, "slicesim replay: plots not drawn (needs /usr/bin/python3 with matplotlib); CSVs are in %s\n",
                   o.out_dir.c_str());
    } else {
      std::printf("wrote %s/summary.csv, idle_slices.csv, idle_overlap.csv and PNG plots\n", o.out_dir.c_str());
    }
  }
  return 0;
}

int Overhead(const std::vector<std::string>& args) {
#ifdef SLICESCHED_HAVE_TORCH_EXECUTORS
  slicesched::OverheadOptions o;
  bool json = false;
  bool pin = false, no_pin = false, direct_on_main = o.direct_on_main;
  std::string direct_allocator = o.direct_cache ? "cache" : "default";
  if (int rc = Flags("overhead")
                   .Switch("--json", &json)
                   .Choice("--model", {"tiny", "small", "llama3-8b"}, &o.model)
                   .Int("--prefills", &o.prefills)
                   .Int("--repetitions", &o.repetitions)
                   .Int("--window", &o.window)
                   .Int("--block", &o.block)
                   .Switch("--pin", &pin)
                   .Switch("--no-pin", &no_pin)
                   .Switch("--direct-on-main", &direct_on_main)
                   .Choice("--direct-allocator", {"cache", "default"}, &direct_allocator)
                   .Choice("--only", {"direct", "scheduled"}, &o.only)
                   .Switch("--null", &o.null_check)
                   .Int("--nap-us", &o.nap_us)
                   .Int("--tail-spin-us", &o.tail_spin_us)
                   .Int("--wake-batch", &o.wake_batch)
                   .Choice("--priorities", {"fcfs", "equal"}, &o.priorities)
                   .Choice("--order", {"abba", "direct-first"}, &o.order)
                   .Seed("--seed", &o.seed)
                   .Parse(args)) {
    return rc;
  }
  // Not given: the default batch, but never more than the window (so that
  // `--window 1` alone still means one prefill at a time).
  const bool wake_given = std::any_of(args.begin(), args.end(), [](const std::string& a) {
    return a == "--wake-batch" || a.rfind("--wake-batch=", 0) == 0;
  });
  if (!wake_given) o.wake_batch = std::clamp(o.wake_batch, 1, std::max(o.window, 1));
  if (pin && no_pin) {
    return Rejected("overhead", absl::InvalidArgumentError("--pin and --no-pin contradict each other; give one"));
  }
  if (pin || no_pin) o.pin = pin;  // neither: the default (pinned)
  o.direct_on_main = direct_on_main;
  o.direct_cache = direct_allocator == "cache";
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("overhead", v);
  auto r = slicesched::RunOverhead(o);
  if (!r.ok()) return Failed("overhead", r.status());
  if (json) {
    std::printf("%s\n", r->ToJson().c_str());
  } else {
    if (r->null_check) {
      std::printf("null check: \"scheduled\" below is the direct loop on a twin thread (an A/A comparison: "
                  "what a scheduler costing nothing would get on this machine)\n");
    }
    std::printf("%lld prefills (context 1), median of %d alternations, %s\n"
                "direct %.3f s, scheduled %.3f s: overhead %.2f%%\n"
                "block by block (%zu pairs of %lld prefills): median %.2f%%, quartiles %.2f%% .. %.2f%%; "
                "%.2f us an operator (%d a prefill, %.1f us each directly)\n%s\n%s\n",
                static_cast<long long>(r->prefills), r->repetitions,
                r->null_check ? "no scheduler" : absl::StrCat(r->window, " in flight").c_str(), r->direct_s,
                r->scheduled_s,
                r->overhead_pct, r->block_ratios.size(), static_cast<long long>(r->block), r->paired_overhead_pct,
                r->paired_q1_pct, r->paired_q3_pct, r->paired_overhead_us_per_op, r->ops_per_prefill,
                r->per_op_direct_us(), r->placement.c_str(), r->pinning.c_str());
  }
  return 0;
#else
  (void)args;
  std::fprintf(stderr,
               "slicesim overhead: this slicesim was built without LibTorch "
               "(SLICESCHED_WITH_TORCH=OFF); the command needs the LibTorch executors\n");
  return 1;
#endif
}

int Load(const std::vector<std::string>& args) {
  slicesched::LoadOptions o;
  std::string socket = "/tmp/sliced-demo/sliced.sock", target;
  bool json = false;
  if (int rc = Flags("load")
                   .Text("--socket", &socket)
                   .Text("--target", &target)
                   .Num("--seconds", &o.seconds)
                   .Text("--trace", &o.trace)
                   .Seed("--seed", &o.seed)
                   .Int("--streams", &o.streams)
                   .Int("--offline-streams", &o.offline_streams)
                   .Num("--token-scale", &o.token_scale)
                   .Text("--online", &o.online_deployment)
                   .Text("--offline", &o.offline_deployment)
                   .Switch("--json", &json)
                   .Parse(args)) {
    return rc;
  }
  o.target = target.empty() ? "unix:" + socket : target;
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("load", v);
  auto r = slicesched::RunLoad(o);
  if (!r.ok()) return Failed("load", r.status());
  std::printf("%s", json ? (r->ToJson() + "\n").c_str() : r->ToText().c_str());
  return 0;
}

int GenerateDirectCommand(const std::vector<std::string>& args) {
#ifdef SLICESCHED_HAVE_TORCH_EXECUTORS
  std::string model = "tiny", safetensors, prompt_text, stop_text;
  uint64_t weights_seed = 1, seed = 0;
  int max_tokens = 0;
  int64_t top_k = 0;
  double temperature = 0, top_p = 1;
  if (int rc = Flags("generate-direct")
                   .Choice("--model", {"tiny", "small", "llama3-8b"}, &model)
                   .Seed("--weights-seed", &weights_seed)
                   .Text("--safetensors", &safetensors)
                   .Text("--prompt", &prompt_text).Required()
                   .Int("--max-tokens", &max_tokens).Required()
                   .Num("--temperature", &temperature)
                   .Num("--top-p", &top_p)
                   .Int("--top-k", &top_k)
                   .Seed("--seed", &seed)
                   .Text("--stop", &stop_text)
                   .Parse(args)) {
    return rc;
  }
  auto ids = [](const std::string& text, const char* flag, std::vector<int64_t>* out) {
    for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
      int64_t v = 0;
      if (!absl::SimpleAtoi(part, &v)) {
        std::fprintf(stderr, "slicesim generate-direct: %s: '%s' is not a token id\n", flag, std::string(part).c_str());
        return false;
      }
      out->push_back(v);
    }
    return true;
  };
  std::vector<int64_t> prompt, stop;
  if (!ids(prompt_text, "--prompt", &prompt) || !ids(stop_text, "--stop", &stop)) return kExitUsage;
  slicesched::executor::SamplingParams sp{.temperature = temperature, .top_p = top_p, .seed = seed, .top_k = top_k};
  if (absl::Status v = slicesched::executor::CheckGenerateDirect(prompt, max_tokens, sp); !v.ok()) {
    return Rejected("generate-direct", v);
  }
  auto dims = slicesched::LlamaPreset(model);
  if (!dims.ok()) return Failed("generate-direct", dims.status());
  auto weights = safetensors.empty()
                     ? slicesched::executor::LlamaWeights::FromSeed(*dims, weights_seed)
                     : slicesched::executor::LlamaWeights::FromSafetensors(*dims, safetensors);
  if (!weights.ok()) return Failed("generate-direct", weights.status());
  auto tokens = slicesched::executor::GenerateDirect(**weights, prompt, max_tokens, sp, stop);
  if (!tokens.ok()) return Failed("generate-direct", tokens.status());
  std::printf("{\"tokens\": [%s]}\n", absl::StrJoin(*tokens, ", ").c_str());
  return 0;
#else
  (void)args;
  std::fprintf(stderr, "slicesim generate-direct: this slicesim was built without LibTorch\n");
  return 1;
#endif
}

int Fidelity(const std::vector<std::string>& args) {
#ifdef SLICESCHED_HAVE_TORCH_EXECUTORS
  slicesched::FidelityOptions o;
  bool json = false;
  bool per_op = false;
  if (int rc = Flags("fidelity")
                   .Switch("--json", &json)
                   .Switch("--per-op", &per_op)
                   .Int("--warmup", &o.warmup)
                   .Choice("--model", {"tiny", "small"}, &o.model)
                   .Int("--calibration", &o.calibration)
                   .Int("--iterations", &o.iterations)
                   .Seed("--seed", &o.seed)
                   .Int("--train-batch", &o.train_batch)
                   .Int("--train-tokens", &o.train_tokens)
                   .Int("--prompt-tokens", &o.prompt_tokens)
                   .Int("--decode-steps", &o.decode_steps)
                   .Num("--drift-smoothing", &o.drift_smoothing)
                   .Parse(args)) {
    return rc;
  }
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("fidelity", v);
  auto r = slicesched::RunFidelity(o);
  if (!r.ok()) return Failed("fidelity", r.status());
  if (json) {
    std::printf("%s\n", r->ToJson().c_str());
  } else {
    std::printf("%s, %s, %d warm-up and %d calibration iterations of each kind\n", r->model.c_str(),
                r->placement.c_str(), r->warmup, r->calibration);
    for (const auto& [name, k] : {std::pair<const char*, const slicesched::FidelityKindResult*>{"train", &r->train},
                                  {"serve", &r->serve},
                                  {"overall", &r->overall}}) {
      std::printf("%-8s %3lld iterations: predicted %.3f ms, measured %.3f ms, error %.2f%% "
                  "(mean per-iteration %.2f%%); per transfer: launch gap %.3f ms, delivery gap %.3f ms\n",
                  name, static_cast<long long>(k->iterations), k->predicted_ms, k->measured_ms, k->error_pct,
                  k->mean_abs_error_pct, k->launch_gap_ms, k->delivery_gap_ms);
    }
    std::printf("learned hand-off per hop: cpu0 -> cpu1 %.3f ms, cpu1 -> cpu0 %.3f ms\n"
                "estimator online MAPE: operators %.2f%%, transfers %.2f%%; target %.2f%%: %s\n",
                r->learned_handoff_01_ms, r->learned_handoff_10_ms, r->op_mape_pct, r->transfer_mape_pct,
                r->target_error_pct,
                r->overall.error_pct <= r->target_error_pct ? "met" : "NOT met");
    std::printf("simulator per-operator error weighted by duration: %.2f%%\n", r->op_wape_pct);
    std::printf("calibration: device factors %.3f %.3f (drift %.3f), overlap %.3f, transfer overlap %.3f\n",
                r->device_factors.size() > 0 ? r->device_factors[0] : 1.0,
                r->device_factors.size() > 1 ? r->device_factors[1] : 1.0, r->drift_factor, r->overlap_factor,
                r->transfer_overlap_factor);
    if (per_op) {
      std::printf("%-44s %3s %7s %12s %12s %8s\n", "operator or hop (scored)", "dev", "samples", "predicted ms",
                  "measured ms", "MAPE %");
      for (const slicesched::FidelityOpStat& s : r->ops) {
        std::printf("%-44s %3d %7lld %12.4f %12.4f %8.2f\n", s.name.c_str(), s.device,
                    static_cast<long long>(s.samples), s.predicted_ms, s.measured_ms, s.mape_pct);
      }
    }
  }
  return 0;
#else
  (void)args;
  std::fprintf(stderr,
               "slicesim fidelity: this slicesim was built without LibTorch "
               "(SLICESCHED_WITH_TORCH=OFF); the command needs the LibTorch executors\n");
  return 1;
#endif
}

int SynthData(const std::vector<std::string>& args) {
  slicesched::synth::DatasetOptions o;
  std::string out;
  bool list = false;
  if (int rc = Flags("synth-data")
                   .Text("--task", &o.task)
                   .Text("--out", &out)
                   .Seed("--seed", &o.seed)
                   .Int("--examples", &o.examples)
                   .Int("--sequence-length", &o.sequence_length)
                   .Int("--num-classes", &o.num_classes)
                   .Switch("--list", &list)
                   .Parse(args)) {
    return rc;
  }
  if (list) {
    for (const auto& t : slicesched::synth::KnownTasks()) {
      std::printf("%-12s %s\n", t.name.c_str(), t.description.c_str());
    }
    return 0;
  }
  if (out.empty()) return UsageError("synth-data", "--out FILE is required");
  if (!out.ends_with(".jsonl") && !out.ends_with(".bin")) {
    return UsageError("synth-data", "--out must end in .jsonl or .bin, got '" + out + "'");
  }
  if (o.task.empty()) return UsageError("synth-data", "--task NAME is required (--list prints the names)");
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("synth-data", v);
  auto ex = slicesched::synth::Generate(o);
  if (!ex.ok()) return Failed("synth-data", ex.status());
  absl::Status st;
  if (out.ends_with(".jsonl")) {
    st = slicesched::synth::WriteJsonl(out, *ex);
  } else {
    st = slicesched::synth::WriteTokensBin(out, *ex);
  }
  if (!st.ok()) return Failed("synth-data", st);
  std::printf("wrote %zu examples of %s to %s\n", ex->size(), o.task.c_str(), out.c_str());
  return 0;
}

int MakeBackbone(const std::vector<std::string>& args) {
#ifdef SLICESCHED_HAVE_YMIR_T2V
  slicesched::executor::PretrainOptions o;
  std::string out;
  bool json = false;
  if (int rc = Flags("make-backbone")
                   .Text("--out", &out).Required()
                   .Seed("--seed", &o.seed)
                   .Int("--rounds", &o.rounds)
                   .Int("--steps", &o.steps_per_round)
                   .Switch("--json", &json)
                   .Parse(args)) {
    return rc;
  }
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("make-backbone", v);
  auto dims = slicesched::LlamaPreset("tiny");
  if (!dims.ok()) return Failed("make-backbone", dims.status());
  auto r = slicesched::executor::PretrainBackbone(*dims, o);
  if (!r.ok()) return Failed("make-backbone", r.status());
  const std::map<std::string, std::string> meta = {
      {"slicesched.pretrain", "synthetic-language merged-LoRA (include/slicesched/experiments/pretrain.h)"},
      {"slicesched.seed", std::to_string(o.seed)},
      {"slicesched.rounds", std::to_string(o.rounds)},
      {"slicesched.steps_per_round", std::to_string(o.steps_per_round)}};
  if (auto st = slicesched::executor::WriteSafetensors(out, r->weights->NamedTensors(), meta); !st.ok()) {
    return Failed("make-backbone", st);
  }
  if (json) {
    std::printf("{\"out\": \"%s\", \"steps\": %zu, \"initial_eval_loss\": %.4f, \"final_eval_loss\": %.4f}\n",
                out.c_str(), r->train_loss.size(), r->initial_eval_loss, r->final_eval_loss);
  } else {
    std::printf("wrote %s: %zu steps, held-out next-token loss %.4f -> %.4f\n", out.c_str(), r->train_loss.size(),
                r->initial_eval_loss, r->final_eval_loss);
  }
  return 0;
#else
  (void)args;
  std::fprintf(stderr, "slicesim make-backbone: this slicesim was built without LibTorch\n");
  return 1;
#endif
}

int YmirEstimators(const std::vector<std::string>& args) {
#ifdef SLICESCHED_HAVE_YMIR_T2V
  slicesched::executor::YmirExperimentOptions o;
  std::string backbone, gains_out;
  bool json = false;
  uint64_t backbone_seed = 1;
  std::string head = o.zero_head ? "zero" : "random", tasks;
  std::string envelope = o.iter_fit.envelope == slicesched::ymir::Envelope::kIsotonic ? "isotonic" : "min";
  std::string time_shift = o.iter_fit.time_shift ? "on" : "off";
  std::string online = o.iter_online ? "on" : "off";
  std::string direction = o.direction == slicesched::executor::YmirDirection::kAsymmetry ? "asymmetry" : "none";
  std::string fit_on, pairs_out;
  double transfer_watch = o.iter_transfer_online ? o.iter_transfer_watch.watch : 0.0;
  std::string transfer_fit = o.iter_transfer_watch.fit == slicesched::ymir::WatchFit::kLoss ? "loss" : "time";
  std::string spatial_step = o.spatial_rule == slicesched::executor::JointStepRule::kSum ? "sum" : "mean";
  std::string probe = o.probe == slicesched::executor::YmirProbe::kHead ? "head" : "trained";
  std::string gain_measure = o.gain_measure == slicesched::executor::YmirGainMeasure::kArea ? "area" : "steps";
  std::string fisher = o.fisher == slicesched::executor::YmirFisher::kModel ? "model" : "empirical";
  std::string embed = o.embed == slicesched::executor::YmirEmbedParams::kLoraHead ? "lora+head" : "lora";
  std::string distance = o.distance == slicesched::executor::YmirDistance::kCosine ? "cosine" : "normalised";
  if (int rc = Flags("ymir-estimators")
                   .Text("--backbone", &backbone)
                   .Seed("--backbone-seed", &backbone_seed)
                   .Seed("--seed", &o.seed)
                   .Int("--steps", &o.normal_steps)
                   .Num("--learning-rate", &o.learning_rate)
                   .Int("--warmup-steps", &o.lr_warmup_steps)
                   .Choice("--head", {"zero", "random"}, &head)
                   .Choice("--spatial-step", {"mean", "sum"}, &spatial_step)
                   .Choice("--probe", {"trained", "head"}, &probe)
                   .Int("--probe-steps", &o.probe_steps)
                   .Int("--fisher-examples", &o.fisher_examples)
                   .Choice("--gain", {"steps", "area"}, &gain_measure)
                   .Int("--gain-window", &o.gain_window)
                   .Text("--tasks", &tasks)
                   .Int("--eval-every", &o.eval_every)
                   .Int("--max-steps-factor", &o.max_steps_factor)
                   .Int("--lora-rank", &o.lora_rank)
                   .Int("--repeats", &o.repeats)
                   .Int("--sequence-length", &o.sequence_length)
                   .Int("--eval-examples", &o.eval_examples)
                   .Num("--iter-prefix-fraction", &o.iter_prefix_fraction)
                   .Int("--stop-loss-epoch-steps", &o.stop_loss_epoch_steps)
                   .Switch("--iter-quadratic", &o.iter_fit.quadratic)
                   .Choice("--iter-envelope", {"min", "isotonic"}, &envelope)
                   .Choice("--iter-time-shift", {"on", "off"}, &time_shift)
                   .Num("--iter-half-life", &o.iter_fit.recency_half_life)
                   .Choice("--iter-online", {"on", "off"}, &online)
                   .Num("--iter-plateau-k", &o.iter_plateau.noise_k)
                   .Num("--iter-plateau-drop", &o.iter_plateau.min_drop)
                   .Num("--iter-plateau-span", &o.iter_plateau.min_span)
                   .Num("--iter-transfer-watch", &transfer_watch)
                   .Choice("--iter-transfer-fit", {"time", "loss"}, &transfer_fit)
                   .Num("--iter-transfer-prior-points", &o.iter_transfer_watch.prior_points)
                   .Choice("--direction", {"none", "asymmetry"}, &direction)
                   .Text("--fit-on", &fit_on)
                   .Text("--pairs-out", &pairs_out)
                   .Text("--gains-out", &gains_out)
                   .Switch("--curves-only", &o.curves_only)
                   .Switch("--similarities-only", &o.similarities_only)
                   .Choice("--fisher", {"empirical", "model"}, &fisher)
                   .Choice("--embed", {"lora", "lora+head"}, &embed)
                   .Choice("--distance", {"normalised", "cosine"}, &distance)
                   .Int("--null-runs", &o.null_runs)
                   .Num("--band-k", &o.band_k)
                   .Int("--label-margin", &o.label_margin)
                   .Num("--lora-alpha", &o.lora_alpha)
                   .Int("--language-vocab", &o.language.vocab)
                   .Int("--language-classes", &o.language.classes)
                   .Int("--train-examples", &o.train_examples)
                   .Int("--batch-size", &o.batch_size)
                   .Switch("--json", &json)
                   .Parse(args)) {
    return rc;
  }
  namespace ex = slicesched::executor;
  o.zero_head = head == "zero";
  o.probe = probe == "head" ? ex::YmirProbe::kHead : ex::YmirProbe::kTrained;
  o.gain_measure = gain_measure == "area" ? ex::YmirGainMeasure::kArea : ex::YmirGainMeasure::kSteps;
  o.fisher = fisher == "model" ? ex::YmirFisher::kModel : ex::YmirFisher::kEmpirical;
  o.embed = embed == "lora+head" ? ex::YmirEmbedParams::kLoraHead : ex::YmirEmbedParams::kLora;
  o.distance = distance == "cosine" ? ex::YmirDistance::kCosine : ex::YmirDistance::kNormalised;
  o.spatial_rule = spatial_step == "sum" ? ex::JointStepRule::kSum : ex::JointStepRule::kMean;
  o.iter_fit.envelope =
      envelope == "min" ? slicesched::ymir::Envelope::kRunningMin : slicesched::ymir::Envelope::kIsotonic;
  o.iter_fit.time_shift = time_shift == "on";
  o.iter_online = online == "on";
  // 0 turns the watch off; anything else is validated by the experiment.
  o.iter_transfer_online = transfer_watch != 0;
  if (o.iter_transfer_online) o.iter_transfer_watch.watch = transfer_watch;
  o.iter_transfer_watch.fit =
      transfer_fit == "loss" ? slicesched::ymir::WatchFit::kLoss : slicesched::ymir::WatchFit::kTime;
  o.direction = direction == "asymmetry" ? ex::YmirDirection::kAsymmetry : ex::YmirDirection::kNone;
  for (const std::string& path : std::vector<std::string>(absl::StrSplit(fit_on, ',', absl::SkipEmpty()))) {
    std::ifstream in(path);
    if (!in) return Failed("ymir-estimators", absl::NotFoundError("--fit-on: cannot read " + path));
    std::stringstream text;
    text << in.rdbuf();
    auto rows = ex::ParseYmirPairsCsv(text.str());
    if (!rows.ok()) return Failed("ymir-estimators", slicesched::Annotate(rows.status(), "--fit-on " + path));
    o.fit_on.insert(o.fit_on.end(), rows->begin(), rows->end());
  }
  if (!tasks.empty()) {
    // NAME[:CLASSES],... (CLASSES defaults to 2).
    o.tasks.clear();
    for (const std::string& item : std::vector<std::string>(absl::StrSplit(tasks, ','))) {
      const size_t colon = item.find(':');
      slicesched::executor::YmirTaskSpec t{.name = item.substr(0, colon)};
      if (colon != std::string::npos && !absl::SimpleAtoi(item.substr(colon + 1), &t.num_classes)) {
        std::fprintf(stderr, "slicesim ymir-estimators: --tasks item '%s': CLASSES after ':' is not an integer\n",
                     item.c_str());
        return 2;
      }
      o.tasks.push_back(t);
    }
  }
  // Bad options are named before the backbone is pretrained (~20 s).
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("ymir-estimators", v);
  auto dims = slicesched::LlamaPreset("tiny");
  if (!dims.ok()) return Failed("ymir-estimators", dims.status());
  std::shared_ptr<const slicesched::executor::LlamaWeights> w;
  if (backbone.empty()) {
    // The default backbone: `slicesim make-backbone --seed backbone_seed`.
    slicesched::executor::PretrainOptions p;
    p.seed = backbone_seed;
    p.language = o.language;  // pretrained on the tasks' own language
    auto r = slicesched::executor::PretrainBackbone(*dims, p);
    if (!r.ok()) return Failed("ymir-estimators", r.status());
    w = r->weights;
  } else {
    auto r = slicesched::executor::LlamaWeights::FromSafetensors(*dims, backbone);
    if (!r.ok()) return Failed("ymir-estimators", r.status());
    w = *r;
  }
  auto rep = slicesched::executor::RunYmirEstimators(*w, o);
  if (!rep.ok()) return Failed("ymir-estimators", rep.status());
  for (const auto& [path, csv] : {std::pair{gains_out, rep->GainsCsv()}, std::pair{pairs_out, rep->PairsCsv()}}) {
    if (path.empty()) continue;
    FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) return Failed("ymir-estimators", absl::UnavailableError("cannot write " + path));
    const bool ok = std::fwrite(csv.data(), 1, csv.size(), f) == csv.size();
    if (std::fclose(f) != 0 || !ok) return Failed("ymir-estimators", absl::DataLossError("writing " + path));
  }
  if (json) {
    std::printf("%s\n", rep->ToJson().c_str());
  } else if (o.similarities_only) {
    for (size_t a = 0; a < rep->tasks.size(); ++a) {
      std::printf("S(%s, .):", rep->tasks[a].c_str());
      for (double v : rep->similarity[a]) std::printf(" %.4f", v);
      std::printf("\n");
    }
  } else {
    for (const auto& s : rep->scores) {
      std::printf("%-8s %3lld pairs (%lld positive): sign accuracy %.1f%% (majority %.1f%%), gain MAPE %.1f%%, r=%.2f;"
                  " %lld neutral, non-neutral accuracy %.1f%% (majority %.1f%%)\n",
                  s.mode.c_str(), static_cast<long long>(s.pairs), static_cast<long long>(s.positive), s.accuracy_pct,
                  s.majority_accuracy_pct, s.mape_pct, s.correlation, static_cast<long long>(s.neutral),
                  s.non_neutral_accuracy_pct, s.non_neutral_majority_pct);
    }
    std::printf("neutral band %.4f (%g x RMS of %zu null-run gains)\n", rep->neutral_band, o.band_k,
                rep->null_runs.size());
    std::printf("iteration estimator (%s, first window %lld steps, estimates available at step %.1f on "
                "average, %lld plateaus): error normal %.1f%%, transfer %.1f%% (%lld pairs; ignoring the gain %.1f%%)\n",
                rep->iteration.online ? "online" : "fixed prefix", static_cast<long long>(o.IterPrefixSteps()),
                rep->iteration.observed_steps_mean, static_cast<long long>(rep->iteration.plateaus),
                rep->iteration.normal_pct, rep->iteration.transfer_pct,
                static_cast<long long>(rep->iteration.transfer_pairs), rep->iteration.transfer_nogain_pct);
    if (rep->iteration.online) {
      std::printf("  fixed prefix %lld steps: error normal %.1f%%, transfer %.1f%%\n",
                  static_cast<long long>(rep->iteration_first_window.prefix_steps),
                  rep->iteration_first_window.normal_pct, rep->iteration_first_window.transfer_pct);
    }
    for (const auto& e : rep->iteration_sweep) {
      std::printf("  prefix %lld steps: error normal %.1f%%, transfer %.1f%%\n", static_cast<long long>(e.prefix_steps),
                  e.normal_pct, e.transfer_pct);
    }
    std::printf("negative pairs %lld: caught %lld (estimator %lld, stop-loss %lld); positive pairs decoupled %lld\n",
                static_cast<long long>(rep->negative_pairs), static_cast<long long>(rep->negative_caught),
                static_cast<long long>(rep->negative_caught_by_estimator),
                static_cast<long long>(rep->negative_caught_by_stop_loss),
                static_cast<long long>(rep->positive_decoupled));
    std::printf("paper (Table 2): accuracy 97.2-98.6%%, gain MAPE 15.5-18.1%%, iteration error 5.7-11.3%% normal, "
                "11.1-15.4%% transfer; %lld training steps in %.1f s\n",
                static_cast<long long>(rep->train_steps), rep->seconds);
  }
  return 0;
#else
  (void)args;
  std::fprintf(stderr, "slicesim ymir-estimators: this slicesim was built without LibTorch\n");
  return 1;
#endif
}

int YmirLut(const std::vector<std::string>& args) {
#ifdef SLICESCHED_HAVE_YMIR_T2V
  slicesched::executor::LutProfileOptions o;
  std::string out, backbone, devices = "1,2", grad_accum = "1,2", batches = "4,8,16", frozen = "0,2", amp = "0,1",
                                  ckpt = "0,1", parallelism = "data,pipeline";
  bool json = false;
  if (int rc = Flags("ymir-lut")
                   .Text("--out", &out).Required()
                   .Text("--backbone", &backbone)
                   .Text("--devices", &devices)
                   .Text("--grad-accum", &grad_accum)
                   .Text("--batches", &batches)
                   .Text("--frozen", &frozen)
                   .Text("--amp", &amp)
                   .Text("--ckpt", &ckpt)
                   .Text("--parallelism", &parallelism)
                   .Int("--iterations", &o.iterations)
                   .Switch("--json", &json)
                   .Parse(args)) {
    return rc;
  }
  auto list = [](const std::string& text, const char* flag, std::vector<int64_t>* v) -> absl::Status {
    v->clear();
    for (absl::string_view part : absl::StrSplit(text, ',')) {
      int64_t x = 0;
      if (!absl::SimpleAtoi(part, &x)) {
        return absl::InvalidArgumentError(std::string(flag) + ": '" + text + "' is not a comma-separated integer list");
      }
      v->push_back(x);
    }
    return absl::OkStatus();
  };
  for (auto [text, flag, v] : {std::tuple{&devices, "--devices", &o.devices},
                               std::tuple{&grad_accum, "--grad-accum", &o.grad_accum},
                               std::tuple{&batches, "--batches", &o.local_batch},
                               std::tuple{&frozen, "--frozen", &o.frozen_layers},
                               std::tuple{&amp, "--amp", &o.amp},
                               std::tuple{&ckpt, "--ckpt", &o.grad_checkpoint}}) {
    if (auto st = list(*text, flag, v); !st.ok()) return UsageError("ymir-lut", std::string(st.message()));
  }
  o.parallelism.clear();
  for (absl::string_view part : absl::StrSplit(parallelism, ',')) {
    if (part == "data") {
      o.parallelism.push_back(slicesched::ymir::Parallelism::kData);
    } else if (part == "pipeline") {
      o.parallelism.push_back(slicesched::ymir::Parallelism::kPipeline);
    } else {
      return UsageError("ymir-lut", "--parallelism: values must be data or pipeline, got '" + parallelism + "'");
    }
  }
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("ymir-lut", v);
  auto dims = slicesched::LlamaPreset("tiny");
  if (!dims.ok()) return Failed("ymir-lut", dims.status());
  // Iteration times do not depend on the weights' values: without
  // --backbone, the seeded tiny preset.
  std::shared_ptr<const slicesched::executor::LlamaWeights> w;
  if (backbone.empty()) {
    auto r = slicesched::executor::LlamaWeights::FromSeed(*dims, 1);
    if (!r.ok()) return Failed("ymir-lut", r.status());
    w = *r;
  } else {
    auto r = slicesched::executor::LlamaWeights::FromSafetensors(*dims, backbone);
    if (!r.ok()) return Failed("ymir-lut", r.status());
    w = *r;
  }
  const slicesched::SteadyClock clock;
  const slicesched::Timestamp t0 = clock.Now();
  auto lut = slicesched::executor::ProfileTimeLut(*w, o, clock);
  if (!lut.ok()) return Failed("ymir-lut", lut.status());
  const double seconds = (clock.Now() - t0).ToSecondsF();
  if (auto st = lut->Save(out); !st.ok()) return Failed("ymir-lut", st);
  // Example lookups: keys the grid did not measure are interpolated (and
  // marked); categorical keys that were not profiled (pipeline parallelism,
  // or an AMP / checkpointing value left out of the grid) are not found.
  using slicesched::ymir::LutKey;
  std::vector<LutKey> probes = {
      LutKey{.devices = o.devices.front(), .grad_accum = o.grad_accum.front(), .local_batch = o.local_batch.front()},
      LutKey{.devices = o.devices.front(), .grad_accum = o.grad_accum.front(), .local_batch = 12},
      LutKey{.devices = o.devices.back(), .grad_accum = 3, .local_batch = 6, .frozen_layers = 1},
      LutKey{.devices = 4, .grad_accum = 1, .local_batch = 8},
      LutKey{.devices = 1, .grad_accum = 1, .local_batch = 8, .amp = true},
      LutKey{.devices = 1, .grad_accum = 1, .local_batch = 12, .grad_checkpoint = true},
      LutKey{.devices = 2, .grad_accum = 1, .local_batch = 8, .parallelism = slicesched::ymir::Parallelism::kPipeline}};
  std::string lookups;
  for (const LutKey& k : probes) {
    auto r = lut->Lookup(k);
    std::string line = json ? "    {\"key\": \"" + k.ToString() + "\", " : "  " + k.ToString() + ": ";
    if (r.ok()) {
      char buf[96];
      std::snprintf(buf, sizeof buf, json ? "\"seconds\": %.6f, \"interpolated\": %s, \"sources\": %zu}"
                                          : "%.6f s%s (%zu source key(s))",
                    r->seconds, json ? (r->interpolated ? "true" : "false") : (r->interpolated ? " interpolated" : ""),
                    r->source.size());
      line += buf;
    } else {
      line += json ? "\"error\": " + slicesched::JsonQuote(slicesched::ToStd(r.status().message())) + "}"
                   : "not found (" + std::string(r.status().message()) + ")";
    }
    lookups += (lookups.empty() ? "" : json ? ",\n" : "\n") + line;
  }
  if (json) {
    std::printf("{\"out\": \"%s\", \"keys\": %zu, \"profile_seconds\": %.1f,\n  \"lookups\": [\n%s\n  ]}\n",
                out.c_str(), lut->entries().size(), seconds, lookups.c_str());
  } else {
    std::printf("wrote %s: %zu keys profiled in %.1f s\n%s\n%s", out.c_str(), lut->entries().size(), seconds,
                lookups.c_str(), lut->ToCsv().c_str());
  }
  return 0;
#else
  (void)args;
  std::fprintf(stderr, "slicesim ymir-lut: this slicesim was built without LibTorch\n");
  return 1;
#endif
}

int YmirCommand(const std::vector<std::string>& args) {
  slicesched::YmirCompareOptions o;
  bool json = false;
  std::string donors = o.config.ilp_donors ? "1" : "0", pair_shares = o.config.ymir_pair_shares ? "1" : "0";
  std::vector<std::string> policies = slicesched::YmirSimPolicyNames();
  policies.push_back("all");
  if (int rc = Flags("ymir")
                   .Text("--trace", &o.trace)
                   .Text("--gains", &o.gains)
                   .Choice("--gains-definition", {"saved", "speedup"}, &o.gains_definition)
                   .Choice("--gains-column", {"gain", "gain_steps"}, &o.gains_column)
                   .Choice("--policy", policies, &o.policy)
                   .Int("--jobs", &o.jobs)
                   .Seed("--seed", &o.config.seed)
                   .Num("--load", &o.load)
                   .Int("--gpus", &o.config.gpus)
                   .Int("--nodes", &o.nodes)
                   .Num("--round", &o.config.round_s)
                   .Num("--restart", &o.config.restart_s)
                   .Int("--ilp-window", &o.config.ilp_window)
                   .Num("--ilp-gap", &o.config.ilp_gap)
                   .Num("--ilp-time-limit", &o.config.ilp_time_limit_s)
                   .Num("--ymir-horizon", &o.config.ymir_horizon_s)
                   .Num("--lambda", &o.config.lambda)
                   .Choice("--ilp-donors", {"0", "1"}, &donors)
                   .Choice("--pair-shares", {"0", "1"}, &pair_shares)
                   .Switch("--json", &json)
                   .Parse(args)) {
    return rc;
  }
  o.config.ilp_donors = donors == "1";
  o.config.ymir_pair_shares = pair_shares == "1";
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("ymir", v);
  auto r = slicesched::RunYmirCompare(o);
  if (!r.ok()) return Failed("ymir", r.status());
  std::printf("%s\n", json ? r->ToJson(o).c_str() : r->ToText().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // This absl build (Debian's) checks lock order on every Mutex::Lock: a
  // lookup in a process-wide graph under one global spin lock, which every
  // thread's every lock takes (the executors' device threads once per
  // operator, and again per pool allocation). It is a debugging aid; the
  // tests keep it, the tools turn it off.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (argc < 2) return Usage(stderr);
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "gmg") return Gmg(args);
  if (cmd == "bench-sim") return BenchSim(args);
  if (cmd == "accuracy") return Accuracy(args);
  if (cmd == "replay") return Replay(args);
  if (cmd == "overhead") return Overhead(args);
  if (cmd == "generate-direct") return GenerateDirectCommand(args);
  if (cmd == "load") return Load(args);
  if (cmd == "fidelity") return Fidelity(args);
  if (cmd == "synth-data") return SynthData(args);
  if (cmd == "make-backbone") return MakeBackbone(args);
  if (cmd == "ymir-estimators") return YmirEstimators(args);
  if (cmd == "ymir") return YmirCommand(args);
  if (cmd == "ymir-lut") return YmirLut(args);
  if (cmd == "help" || cmd == "--help" || cmd == "-h") return Usage(stdout);
  std::fprintf(stderr, "slicesim: unknown command '%s'\n", cmd.c_str());
  return Usage(stderr);
}
