// slicesim: the offline simulator and experiment driver.
//
//   slicesim gmg [--config FILE]   build a GMG from a config and report it
//
// Commands live in the slicesched::experiments library; this file only
// parses arguments.
#include <cstdio>
#include <string>
#include <vector>

#include "slicesched/experiments/gmg_demo.h"

namespace {

int Usage(FILE* to) {
  std::fprintf(to,
               "usage: slicesim COMMAND [options]\n\n"
               "commands:\n"
               "  gmg [--config FILE]   build a Global Mapping Graph from a slicesim config\n"
               "                        (default: the embedded configs/slicesim.yaml) and\n"
               "                        print what it holds\n"
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage(stderr);
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "gmg") return Gmg(args);
  if (cmd == "help" || cmd == "--help" || cmd == "-h") return Usage(stdout);
  std::fprintf(stderr, "slicesim: unknown command '%s'\n", cmd.c_str());
  return Usage(stderr);
}
