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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage(stderr);
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "gmg") return Gmg(args);
  if (cmd == "bench-sim") return BenchSim(args);
  if (cmd == "accuracy") return Accuracy(args);
  if (cmd == "help" || cmd == "--help" || cmd == "-h") return Usage(stdout);
  std::fprintf(stderr, "slicesim: unknown command '%s'\n", cmd.c_str());
  return Usage(stderr);
}
