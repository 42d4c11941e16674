// A gRPC load generator for a running `sliced`: what `tools/run` drives after
// starting the daemon, and the daemon's loopback load test.
//
// Two modes, both over Serving.Generate:
//
//   open loop (streams == 0): online requests arrive as the built-in workload
//     model (workload/trace.h GenerateBuiltInWorkload: parameters derived from
//     the Azure LLM code trace, documented there) or a trace file in that
//     format (`trace`, LoadAzureLlmTrace) says, for `seconds`. The trace's
//     token counts are for a large model; the tiny demo model would spend
//     seconds of CPU on a 7,000-token prompt, so prompt lengths are divided
//     by `token_scale` (rounded up, at least 1); output lengths are kept, capped
//     at `max_output_tokens`. Meanwhile `offline_streams` closed-loop clients keep
//     offline requests (64-token prompts, 32 new tokens) flowing to the
//     offline deployment, filling the idle slices.
//   closed loop (streams > 0): `streams` concurrent clients each send online
//     requests back to back (`closed_prompt_tokens`, `closed_output_tokens`)
//     for `seconds` (the 200-stream loopback test).
//
// Token ids of prompts are drawn uniformly from [0, vocab) with one seeded
// generator per client. A request is "lost" when its stream ends OK with fewer
// tokens than asked for and no stop token; errors are counted by status code.
// SLO attainment: the share of online requests whose first token came within
// ttft_slo_ms of sending and whose mean time per further token was within
// tpot_slo_ms. Utilisation: Admin.Devices busy fractions (over the last
// minute) read when the load ends.
//
// This is a measurement tool that runs in real time (it sleeps until each
// arrival); tests drive it with short durations.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace slicesched {

struct LoadOptions {
  std::string target;  // gRPC target, e.g. "unix:/tmp/sliced-demo/sliced.sock"
  double seconds = 20;
  std::string trace;   // empty: the built-in workload model
  uint64_t seed = 1;
  double token_scale = 16;
  int64_t max_output_tokens = 64;
  std::string online_deployment = "tiny-online";
  std::string offline_deployment = "tiny-offline";  // empty: no offline load
  int offline_streams = 2;
  int streams = 0;  // > 0: closed-loop mode with this many clients
  int64_t closed_prompt_tokens = 32;
  int64_t closed_output_tokens = 16;
  int64_t vocab = 256;
  uint32_t ttft_slo_ms = 1000;
  uint32_t tpot_slo_ms = 200;
  double rpc_timeout_s = 300;
  // InvalidArgument naming the option (as slicesim load's flag, else the
  // field) and its value: seconds > 0, token_scale >= 1, streams and
  // offline_streams in 0..4096, vocab >= 1. RunLoad checks it first.
  absl::Status Validate() const;
};

struct LoadReport {
  struct Class {
    int64_t sent = 0;
    int64_t completed = 0;  // OK with every token
    int64_t lost = 0;       // OK but short (must stay 0)
    std::map<std::string, int64_t> errors;  // by gRPC status code name
    int64_t tokens = 0;
    double ttft_p50_ms = 0, ttft_p99_ms = 0;
    double latency_p50_ms = 0, latency_p99_ms = 0;
    double slo_attainment = 0;  // online only
  };
  Class online, offline;
  double wall_s = 0;
  double tokens_per_s = 0;  // both classes
  std::vector<double> device_busy;  // Admin.Devices busy_fraction, by device
  double mean_busy = 0;
  std::string mode;  // "open-loop (built-in model)" / "open-loop (TRACE)" / "closed-loop N streams"

  std::string ToJson() const;
  std::string ToText() const;
};

// Fails only when the daemon cannot be reached or the trace cannot be read;
// failed requests are counted in the report.
absl::StatusOr<LoadReport> RunLoad(const LoadOptions& options);

}  // namespace slicesched
