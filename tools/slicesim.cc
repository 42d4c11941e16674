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
  for (size_t i = 0; i < args.size(); ++i) {
    int64_t v = 0;
    if (args[i] == "--json") {
      json = true;
    } else if (IntFlag(args, &i, "--devices", &v)) {
      o.devices = static_cast<int>(v);
    } else if (IntFlag(args, &i, "--ops", &v)) {
      o.ops = static_cast<int>(v);
    } else if (IntFlag(args, &i, "--repetitions", &v)) {
      o.repetitions = static_cast<int>(v);
    } else if (IntFlag(args, &i, "--seed", &v)) {
      o.seed = static_cast<uint64_t>(v);
    } else {
      std::fprintf(stderr, "slicesim bench-sim: unknown argument '%s'\n", args[i].c_str());
      return 2;
    }
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage(stderr);
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "gmg") return Gmg(args);
  if (cmd == "bench-sim") return BenchSim(args);
  if (cmd == "help" || cmd == "--help" || cmd == "-h") return Usage(stdout);
  std::fprintf(stderr, "slicesim: unknown command '%s'\n", cmd.c_str());
  return Usage(stderr);
}
