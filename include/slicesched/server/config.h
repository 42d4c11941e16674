// Configuration of the `sliced` daemon.
//
// `sliced --config FILE` reads one YAML file; without --config the embedded
// default (configs/sliced.yaml, a CPU-only demo) is used. Every knob is
// documented here and in that file:
//
//   cluster:                    # the accelerator set (AcceleratorSet::FromConfig)
//     devices: [{name: cpu, count: 4, type: cpu, memory: 2GiB, backend: cpu}]
//     links: {default: {bandwidth: 10GB/s, latency: 5us}}
//   deployments:                # models served from the start (more can be
//     - name: chat              # registered over gRPC); names are unique
//       model: tiny             # a preset name, or an inline `model:` map
//       weights: {seed: 1}      # or {safetensors: /path/model.safetensors}
//       role: online            # online | offline
//       partitions: [single]    # optional; default: every partition
//   scheduler:
//     volume_ms: 50             # scheduling volume v per round (> 0)
//     offline_queue_limit: 1    # online ops outstanding on a device before offline waits (>= 1)
//     offline_aging_s: 30       # offline work older than this goes first (>= 0)
//     timeliness: 0.1           # t of Eq 3 (> 0)
//     prefill_chunk_tokens: 640 # online prompts of 2x this or more are
//                               # prefilled in pieces of about this size (0: never)
//     offline_prefill_chunk_tokens: 512  # the same for offline prompts
//     online_new_device_cost_ms: 100     # an online instance's extra device must save this
//     online_stream_device_cost_ms: 50   # ... a device of another streaming conversation this
//     stream_idle_after_s: 2             # a conversation's cache idle this long stops counting
//     offline_avoids_online_streams: true  # unaged offline work keeps off such devices
//     pipeline_online_prefill: true  # a long online prompt's pieces run as a
//                               # pipeline whose caches end on one device
//     owner_nap_us: 100         # CPU devices: the master's nap between looks
//                               # at busy executors (>= 0; the most it adds to
//                               # a completion's latency); 0 = woken by the
//                               # device threads for every completion
//   listen:
//     unix_socket: /run/sliced/sliced.sock   # "" disables it
//     tcp: 0.0.0.0:50051        # optional; requires tls
//     tls: {cert: /etc/sliced/tls.crt, key: /etc/sliced/tls.key}
//     admin_token: secret       # optional; required by Admin calls when set
//     metrics: 127.0.0.1:9464   # optional; Prometheus GET /metrics over plain
//                               # HTTP (no TLS, no auth: bind it to a trusted
//                               # interface); "" or absent = off
//   planner:                    # fine-tuning jobs (server/job_runner.h)
//     interval_s: 120           # planning round period (> 0); also on arrivals
//                               # and completions
//     mode: ymir                # ymir (joint ILP with transfer) | elastic
//                               # (the same ILP with no pair candidates)
//     gains: /path/gains.csv    # optional transfer gains (task_a, task_b,
//                               # mode, gain; relative to the config file)
//     checkpoint_interval_s: 30 # adapters + optimizer saved this often (> 0)
//                               # and on every preempt / pause
//     prefetch_s: 30            # a paused job's data is prepared this long
//                               # before its planned resume (>= 0)
//     eval_every_steps: 0       # evaluate every N optimizer steps; 0 = once
//                               # per epoch
//   state_dir: /var/lib/sliced  # SQLite state (absolute path)
//   log_level: info             # trace|debug|info|warn|error|critical|off
//
// Parsing is one validation pass: every problem is reported, each as
// "SOURCE:LINE:COL: FIELD_PATH: MESSAGE" (see common/config.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "slicesched/common/config.h"
#include "slicesched/common/units.h"
#include "slicesched/gmg/accelerator.h"
#include "slicesched/gmg/llama.h"
#include "yaml-cpp/yaml.h"

namespace slicesched {

enum class DeploymentRole : uint8_t { kOnline, kOffline };
absl::string_view DeploymentRoleName(DeploymentRole role);  // "online"/"offline"

struct WeightsConfig {
  enum class Kind : uint8_t { kSeed, kSafetensors };
  Kind kind = Kind::kSeed;
  uint64_t seed = 0;             // kSeed: deterministic random weights
  std::string safetensors_path;  // kSafetensors: absolute after parsing
};

struct DeploymentConfig {
  std::string name;
  std::string model_preset;  // the preset name, or empty for an inline model
  LlamaDims model;
  WeightsConfig weights;
  DeploymentRole role = DeploymentRole::kOnline;
  std::vector<std::string> partitions;  // empty = every partition of the model
  // A SentencePiece model file: batch requests may then give text
  // (jobs/tokenizer.h). Empty = token ids only.
  std::string tokenizer;

  // The deployment as a YAML map in the config file's syntax (what the state
  // store persists); ParseDeploymentConfig reads it back.
  std::string ToYaml() const;
};

struct SchedulerConfig {
  Duration volume = Duration::Millis(50);
  int64_t offline_queue_limit = 1;
  Duration offline_aging = Duration::Seconds(30);
  double timeliness = 0.1;
  int64_t prefill_chunk_tokens = 640;          // SliceSchedulerOptions' (0: never chunk)
  int64_t offline_prefill_chunk_tokens = 512;
  // SliceSchedulerOptions' (slicesched/sched/slice_scheduler.h).
  Duration online_new_device_cost = Duration::Millis(100);
  Duration online_stream_device_cost = Duration::Millis(50);
  Duration stream_idle_after = Duration::Seconds(2);
  bool offline_avoids_online_streams = true;
  bool pipeline_online_prefill = true;
  // The LibTorch executors' ExecutorOptions::owner_nap; unset: theirs.
  std::optional<Duration> owner_nap;
};

struct PlannerConfig {
  // kYmir: the joint ILP with transfer pairs; kElastic: the same ILP
  // without pairs; kSrtf and kPollux: the baselines of ymir/baselines.h.
  enum class Mode : uint8_t { kYmir, kElastic, kSrtf, kPollux };
  // How a spatial pair's joint step moves the shared LoRA adapter: the mean
  // of the two tasks' optimizer steps (a pair trains at most as fast as one
  // task alone), or their sum (multi-task training on the summed loss, one
  // optimizer per task; how the estimators measure spatial gains, so a
  // gains table from `slicesim ymir-estimators` holds under it).
  enum class SpatialStep : uint8_t { kMean, kSum };
  Duration interval = Duration::Seconds(120);
  Mode mode = Mode::kYmir;
  SpatialStep spatial_step = SpatialStep::kMean;
  std::string gains_path;  // "" = no transfer estimates (no pairs)
  // A gains table's neutral rows (its `sign` column: the repeats' interval
  // includes 0): false = never paired (the default), true = paired on their
  // point estimates (ymir::YmirGainsLoadOptions::pair_neutral).
  bool pair_neutral = false;
  Duration checkpoint_interval = Duration::Seconds(30);
  Duration prefetch = Duration::Seconds(30);
  int64_t eval_every_steps = 0;
  // Held-out examples of a job: the last fifth of its dataset, at most this
  // many (1..2^20). More makes each evaluation steadier (a loss target is
  // met on the measured curve, not on its noise) and slower.
  int64_t max_eval_examples = 128;
  // Ymir's time LUT (ymir/time_lut.h CSV, `slicesim ymir-lut`): "" = none.
  // With it the runner derives the iteration times of GPU counts it has not
  // measured from the LUT, and folds measured iterations back into it
  // (written back to the same file). See server/job_runner.h.
  std::string time_lut_path;
  // With a time LUT: a job whose key the LUT holds as measured skips
  // profiling (no micro-batches run) and is queued with the LUT's time.
  bool profile_from_lut = false;
};
absl::string_view PlannerModeName(PlannerConfig::Mode mode);  // "ymir" / "elastic" / "srtf" / "pollux"

struct ListenConfig {
  std::string unix_socket = "/run/sliced/sliced.sock";  // empty = disabled
  std::string tcp_address;  // "host:port"; empty = no TCP listener
  std::string tls_cert;     // PEM paths; both set whenever tcp_address is
  std::string tls_key;
  std::string admin_token;  // empty = Admin calls need no token
  std::string metrics_address;  // "host:port" of the HTTP /metrics listener; empty = off
};

// Offline batch jobs (server/batch_runner.h).
struct BatchConfig {
  int64_t max_inflight = 16;  // batch requests in the scheduler at once (>= 1)
};

struct SlicedConfig {
  std::string source;  // file path or "<embedded:configs/sliced.yaml>"
  AcceleratorSet cluster;
  std::vector<DeploymentConfig> deployments;
  SchedulerConfig scheduler;
  PlannerConfig planner;
  BatchConfig batch;
  ListenConfig listen;
  std::string state_dir = "/var/lib/sliced";
  std::string log_level = "info";

  const DeploymentConfig* FindDeployment(std::string_view name) const;
};

// Validates a whole config tree; `source` prefixes error positions and, when
// it is a file path, anchors relative safetensors paths.
absl::StatusOr<SlicedConfig> ParseSlicedConfig(const YAML::Node& root, absl::string_view source);

// Reads and validates FILE (NotFound when it does not exist).
absl::StatusOr<SlicedConfig> LoadSlicedConfig(const std::string& path);

// What is wrong with PATH where the daemon needs an absolute path (state_dir,
// a unix socket); "" when it is one.
std::string AbsolutePathProblem(std::string_view path);

// What is wrong with PATH as a unix socket path (listen.unix_socket's rules:
// absolute, at most 107 bytes, sockaddr_un's limit); "" when it is usable.
std::string UnixSocketPathProblem(std::string_view path);

// sliced's command-line overrides of a loaded config: --socket replaces
// listen.unix_socket, --state-dir replaces state_dir (empty: keep the
// config's). They are checked by the config's rules; InvalidArgument names
// the flag, and the config is unchanged on error.
struct SlicedOverrides {
  std::string unix_socket;
  std::string state_dir;
};
absl::Status ApplySlicedOverrides(const SlicedOverrides& overrides, SlicedConfig* config);

// The embedded configs/sliced.yaml, as text and parsed.
std::string_view DefaultSlicedConfigYaml();
absl::StatusOr<SlicedConfig> DefaultSlicedConfig();

// Parses one deployment map (an element of `deployments:` or the text of
// DeploymentConfig::ToYaml()). Errors go to the reader's sink. When `cluster`
// is given, partitions needing more devices than it has are rejected.
// `base_dir` anchors a relative safetensors path (empty: leave it relative).
DeploymentConfig ParseDeploymentConfig(const ConfigReader& d, const AcceleratorSet* cluster,
                                       absl::string_view base_dir);

// Reads a deployment persisted with ToYaml() (no cluster check).
absl::StatusOr<DeploymentConfig> DeploymentConfigFromYaml(absl::string_view yaml,
                                                          absl::string_view source);

}  // namespace slicesched
