// slicesim: the offline simulator and experiment driver.
//
//   slicesim gmg [--config FILE]   build a GMG from a config and report it
//
// Commands live in the slicesched::experiments library; this file only
// parses arguments.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "slicesched/experiments/accuracy.h"
#include "slicesched/experiments/bench_sim.h"
#include "slicesched/experiments/gmg_demo.h"
#include "slicesched/experiments/replay.h"
#ifdef SLICESCHED_HAVE_TORCH_EXECUTORS
#include "slicesched/executor/overhead.h"
#endif

namespace {

int Usage(FILE* to) {
  std::fprintf(to,
               "usage: slicesim COMMAND [options]\n\n"
               "commands:\n"
               "  gmg [--config FILE]   build a Global Mapping Graph from a slicesim config\n"
               "                        (default: the embedded configs/slicesim.yaml) and\n"
               "                        print what it holds\n"
               "  bench-sim [--devices N] [--ops K] [--repetitions R] [--seed S] [--json]\n"
               "                        time the simulator on a realistic Llama3-8B snapshot\n"
               "  bench-sim --sweep DIR  the same over 8/64/512 devices x 1k..50k operators\n"
               "  accuracy [--trace FILE] [--minutes M] [--load-scale X] [--seed S] [--json]\n"
               "                        simulator and estimator accuracy against a ground-truth\n"
               "                        cluster replaying a trace (default: built-in Azure-derived model)\n"
               "  replay [--trace FILE] [--policy NAME|all] [--minutes M] [--seed S]\n"
               "         [--load-scale X] [--out DIR]\n"
               "                        the paper's co-location experiment on the virtual cluster\n"
               "  overhead [--model tiny|small] [--prefills N] [--repetitions R] [--json]\n"
               "                        scheduled vs direct execution of N context-1 prefills on\n"
               "                        the LibTorch executors (paper Table 1; needs LibTorch)\n"
               "  help                  this text\n");
  return to == stdout ? 0 : 2;
}

int Gmg(const std::vector<std::string>& args) {
  std::string config;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--config" && i + 1 < args.size()) {
      config = args[++i];
    } else {
      std::fprintf(stderr, "slicesim gmg: unknown argument '%s'\n", args[i].c_str());
      return 2;
    }
  }
  auto c = slicesched::LoadGmgDemoConfig(config);
  if (!c.ok()) {
    std::fprintf(stderr, "slicesim gmg: %s\n", std::string(c.status().message()).c_str());
    return 1;
  }
  auto report = slicesched::RunGmgDemo(*c);
  if (!report.ok()) {
    std::fprintf(stderr, "slicesim gmg: %s\n", std::string(report.status().message()).c_str());
    return 1;
  }
  std::fputs(report->c_str(), stdout);
  return 0;
}

// Parses "--name VALUE" integer flags; returns false (after printing) on error.
bool IntFlag(const std::vector<std::string>& args, size_t* i, const char* name, int64_t* out) {
  if (args[*i] != name) return false;
  if (*i + 1 >= args.size() || !absl::SimpleAtoi(args[*i + 1], out)) {
    std::fprintf(stderr, "slicesim: %s needs an integer\n", name);
    std::exit(2);
  }
  ++*i;
  return true;
}

int BenchSim(const std::vector<std::string>& args) {
  slicesched::BenchSimOptions o;
  bool json = false;
  std::string sweep_dir;
  for (size_t i = 0; i < args.size(); ++i) {
    int64_t v = 0;
    if (args[i] == "--json") {
      json = true;
    } else if (args[i] == "--sweep" && i + 1 < args.size()) {
      sweep_dir = args[++i];
    } else if (IntFlag(args, &i, "--devices", &v)) {
      o.devices = static_cast<int>(v);
    } else if (IntFlag(args, &i, "--ops", &v)) {
      o.ops = static_cast<int>(v);
    } else if (IntFlag(args, &i, "--repetitions", &v)) {
      o.repetitions = static_cast<int>(v);
    } else if (IntFlag(args, &i, "--seed", &v)) {
      o.seed = static_cast<uint64_t>(v);
    } else if (IntFlag(args, &i, "--horizon-us", &v)) {
      o.horizon_us = v;
    } else {
      std::fprintf(stderr, "slicesim bench-sim: unknown argument '%s'\n", args[i].c_str());
      return 2;
    }
  }
  if (!sweep_dir.empty()) {
    absl::Status st = slicesched::RunBenchSimSweep({8, 64, 512}, {1000, 2000, 5000, 10000, 20000, 50000},
                                                   o.repetitions, sweep_dir);
    if (!st.ok()) {
      std::fprintf(stderr, "slicesim bench-sim: %s\n", std::string(st.message()).c_str());
      return 1;
    }
    std::printf("wrote %s/bench_sim.csv (plot: bench/plots/plot_bench_sim.py %s)\n", sweep_dir.c_str(),
                sweep_dir.c_str());
    return 0;
  }
  auto r = slicesched::RunBenchSim(o);
  if (!r.ok()) {
    std::fprintf(stderr, "slicesim bench-sim: %s\n", std::string(r.status().message()).c_str());
    return 1;
  }
  if (json) {
    std::printf("%s\n", r->ToJson().c_str());
  } else {
    std::printf("devices %d, instances %lld, simulated %lld operators (%lld compute, %lld transfers)\n"
                "snapshot %.1f us, construction %.1f us, simulation %.1f us (median of %d)\n"
                "%.0f simulated operators per ms, construction included (paper: 176.8)\n",
                r->devices, static_cast<long long>(r->instances), static_cast<long long>(r->ops),
                static_cast<long long>(r->compute_ops), static_cast<long long>(r->transfers), r->snapshot_us,
                r->construct_us, r->simulate_us, o.repetitions, r->ops_per_ms);
  }
  return 0;
}

// Parses "--name VALUE" floating-point flags.
bool DoubleFlag(const std::vector<std::string>& args, size_t* i, const char* name, double* out) {
  if (args[*i] != name) return false;
  if (*i + 1 >= args.size() || !absl::SimpleAtod(args[*i + 1], out)) {
    std::fprintf(stderr, "slicesim: %s needs a number\n", name);
    std::exit(2);
  }
  ++*i;
  return true;
}

int Accuracy(const std::vector<std::string>& args) {
  slicesched::AccuracyOptions o;
  bool json = false;
  for (size_t i = 0; i < args.size(); ++i) {
    int64_t v = 0;
    if (args[i] == "--json") {
      json = true;
    } else if (args[i] == "--trace" && i + 1 < args.size()) {
      o.trace = args[++i];
    } else if (DoubleFlag(args, &i, "--minutes", &o.minutes) || DoubleFlag(args, &i, "--load-scale", &o.load_scale) ||
               DoubleFlag(args, &i, "--warmup", &o.warmup_s) ||
               DoubleFlag(args, &i, "--predict-every", &o.predict_every_s)) {
    } else if (IntFlag(args, &i, "--seed", &v)) {
      o.seed = static_cast<uint64_t>(v);
    } else {
      std::fprintf(stderr, "slicesim accuracy: unknown argument '%s'\n", args[i].c_str());
      return 2;
    }
  }
  auto r = slicesched::RunAccuracy(o);
  if (!r.ok()) {
    std::fprintf(stderr, "slicesim accuracy: %s\n", std::string(r.status().message()).c_str());
    return 1;
  }
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
  bool json = false;
  for (size_t i = 0; i < args.size(); ++i) {
    int64_t v = 0;
    if (args[i] == "--json") {
      json = true;
    } else if (args[i] == "--trace" && i + 1 < args.size()) {
      o.trace = args[++i];
    } else if (args[i] == "--policy" && i + 1 < args.size()) {
      o.policy = args[++i];
    } else if (args[i] == "--out" && i + 1 < args.size()) {
      o.out_dir = args[++i];
    } else if (args[i] == "--no-progress") {
      o.progress = false;
    } else if (DoubleFlag(args, &i, "--minutes", &o.minutes) || DoubleFlag(args, &i, "--load-scale", &o.load_scale)) {
    } else if (IntFlag(args, &i, "--seed", &v)) {
      o.seed = static_cast<uint64_t>(v);
    } else if (IntFlag(args, &i, "--threads", &v)) {
      o.threads = static_cast<int>(v);
    } else {
      std::fprintf(stderr, "slicesim replay: unknown argument '%s'\n", args[i].c_str());
      return 2;
    }
  }
  auto r = slicesched::RunReplay(o);
  if (!r.ok()) {
    std::fprintf(stderr, "slicesim replay: %s\n", std::string(r.status().message()).c_str());
    return 1;
  }
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
  (void)json;
  return 0;
}

int Overhead(const std::vector<std::string>& args) {
#ifdef SLICESCHED_HAVE_TORCH_EXECUTORS
  slicesched::OverheadOptions o;
  bool json = false;
  for (size_t i = 0; i < args.size(); ++i) {
    int64_t v = 0;
    if (args[i] == "--json") {
      json = true;
    } else if (args[i] == "--model" && i + 1 < args.size()) {
      o.model = args[++i];
    } else if (IntFlag(args, &i, "--prefills", &v)) {
      o.prefills = v;
    } else if (IntFlag(args, &i, "--repetitions", &v)) {
      o.repetitions = static_cast<int>(v);
    } else if (IntFlag(args, &i, "--seed", &v)) {
      o.seed = static_cast<uint64_t>(v);
    } else {
      std::fprintf(stderr, "slicesim overhead: unknown argument '%s'\n", args[i].c_str());
      return 2;
    }
  }
  auto r = slicesched::RunOverhead(o);
  if (!r.ok()) {
    std::fprintf(stderr, "slicesim overhead: %s\n", std::string(r.status().message()).c_str());
    return 1;
  }
  if (json) {
    std::printf("%s\n", r->ToJson().c_str());
  } else {
    std::printf("%lld prefills (context 1), median of %d alternations\n"
                "direct %.3f s, scheduled %.3f s: overhead %.2f%%\n%s\n",
                static_cast<long long>(r->prefills), r->repetitions, r->direct_s, r->scheduled_s,
                r->overhead_pct, r->placement.c_str());
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage(stderr);
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "gmg") return Gmg(args);
  if (cmd == "bench-sim") return BenchSim(args);
  if (cmd == "accuracy") return Accuracy(args);
  if (cmd == "replay") return Replay(args);
  if (cmd == "overhead") return Overhead(args);
  if (cmd == "help" || cmd == "--help" || cmd == "-h") return Usage(stdout);
  std::fprintf(stderr, "slicesim: unknown command '%s'\n", cmd.c_str());
  return Usage(stderr);
}
