// `slicesim gmg`: builds a GMG from a slicesim configuration and reports what
// it holds: the accelerator set, the model's templates with exact byte
// counts, and a demo run (a prefill then decode steps attached to its KV
// cache, placed by one of the template's candidate partitions) walked through
// the node state machine, with per-device memory and frontiers after each
// phase and the size of a snapshot.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "slicesched/common/config.h"
#include "slicesched/gmg/accelerator.h"
#include "slicesched/gmg/llama.h"

namespace slicesched {

struct GmgDemoConfig {
  AcceleratorSet cluster;
  LlamaDims model;
  int64_t prefill_tokens = 2048;
  int64_t decode_steps = 4;
  std::string partition = "pp2";
  std::vector<std::string> devices;
};

// Parses a slicesim configuration (see configs/slicesim.yaml). All errors are
// reported at once, each with its file position.
absl::StatusOr<GmgDemoConfig> ParseGmgDemoConfig(const YAML::Node& root, absl::string_view source);

// The configuration compiled into the binary (configs/slicesim.yaml).
absl::StatusOr<GmgDemoConfig> DefaultGmgDemoConfig();
// Loads FILE, or the embedded default when `path` is empty.
absl::StatusOr<GmgDemoConfig> LoadGmgDemoConfig(const std::string& path);

// Runs the demo and returns the human-readable report.
absl::StatusOr<std::string> RunGmgDemo(const GmgDemoConfig& config);

}  // namespace slicesched
