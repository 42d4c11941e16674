// The master of the `sliced` daemon: the one owner of the Global Mapping Graph.
//
// The GMG, the scheduler, the estimators and the execution backend take no
// locks (gmg.h): they live on ONE owner thread, the master's event loop.
// Every public method below may be called from any thread (the gRPC handler
// threads); it posts a command (a std::function) to the loop's queue and
// waits for the result, so nothing outside the loop ever touches the GMG.
//
// One loop iteration:
//   1. run the queued commands (register, submit, cancel, queries);
//   2. advance the backend to the steady-clock time `now`, feeding every
//      completion record to the estimators (OnlineLearner);
//   3. retire finished instances and publish instance state changes to the
//      watchers (InstanceRecord);
//   4. let the scheduler (SliceScheduler) issue work from the unscheduled
//      frontier, then let the backend start what is ready;
//   5. save the estimators every `estimator_save_interval`;
//   6. sleep until the next backend completion, a new command, or 50 ms.
//
// Backend, chosen at start from the devices' configured backends:
//   - `cpu` devices (all of them): the LibTorch executors (the RealBackend
//     that a LibTorch build registers, server/extensions.h, over
//     executor/kernels/llama_serving.h): one thread per device runs the real
//     operators of every deployment; Generate works. A cluster that mixes
//     `cpu` with other backends is refused. In a build without LibTorch the
//     cpu devices fall back to the virtual cluster (logged; Devices/Status
//     report "virtual (configured: cpu)") and Generate is refused.
//   - `virtual` / `emulated` devices: the VirtualCluster, its virtual time
//     driven by the real steady clock, so operators "run" for the time the
//     ground-truth cost model gives them (daemon tests at paper scale).
//     There are no tokens: Generate is refused (FailedPrecondition).
//   - `cuda` devices are refused at start (FailedPrecondition).
// The loop sleeps until a command, a backend event (the executors notify
// it) or the next virtual completion.
//
// Generate (LibTorch backend): one request is a prefill instance of the
// deployment's prefill template (B = 1, S = prompt length) followed by one
// decode instance per further token (LlamaDecodeStep, attached to the
// prefill's retained KV checkpoints, which every step grows in place). The
// loop starts the next step when the previous one is DONE and its sampled
// token is known; step k samples with seed + k. Tokens are appended to the
// request's GenerationRecord as they come; the KV checkpoints are released
// when the request ends (length, stop token, cancel, failure). Admission
// rejects a request whose KV cache cannot fit on any device.
//
// Raw Submit on the LibTorch backend: SubmitRequest carries no token ids, so
// the embedding of a submitted prefill/decode instance reads token ids
// derived from the instance id ((id * 7919 + i) mod vocab).
//
// Deployments: registering one builds its Llama prefill/decode templates,
// named "<deployment>/prefill" and "<deployment>/decode" (the deployment
// name, not the model name, prefixes them, so two deployments of one model
// keep separate weights), and loads the weights of one replica onto every
// aligned device group of every enabled partition (for a k-slot partition,
// devices g*k .. g*k+k-1), which is where SliceScheduler looks for them.
// With the virtual backend weights are byte counts only: their contents
// (seed or safetensors file) are not read. Deployments are persisted in the
// StateStore and re-registered at start; deployments in the config file
// take precedence over persisted ones of the same name.
//
// Estimators: restored from the StateStore ("op", "transfer") at start,
// saved periodically, at Drain and at Shutdown; the runtime calibration
// (kind "calibration", RuntimeCalibration::Save) with them. A saved state that
// does not fit (another device count, a renamed or retyped device, a corrupt
// text) is logged and ignored: that part starts cold.
//
// Calibration in the log: a line ("calibration: device cpu2 speed factor
// 1.000 -> 1.134 ...") when a factor has moved by more than 10% since its
// last line, at most one per factor a second, so a run's log holds each
// factor's trajectory; Status reports the current values.
//
// Retained checkpoints (KV caches produced by prefill instances) are
// released `checkpoint_ttl` after they were produced or last attached.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "slicesched/common/clock.h"
#include "slicesched/common/ids.h"
#include "slicesched/common/units.h"
#include "slicesched/estimate/calibration.h"
#include "slicesched/estimate/estimators.h"
#include "slicesched/gmg/gmg.h"
#include "slicesched/gmg/snapshot.h"
#include "slicesched/jobs/tokenizer.h"
#include "slicesched/server/config.h"
#include "slicesched/server/metrics.h"
#include "slicesched/server/state_store.h"
#include "slicesched/server/timeline.h"

namespace slicesched {

struct Feedback;       // sched/backend.h
struct ScheduleStats;  // sched/policy.h
namespace executor {
class LlamaWeights;        // executor/llama/llama_ops.h
struct LlamaTrainJob;      // executor/kernels/llama_kernels.h
struct TrainBatch;         // executor/train/train_ops.h
}  // namespace executor

struct MasterOptions {
  std::string version = "0.1.0";
  Duration estimator_save_interval = Duration::Seconds(60);
  Duration checkpoint_ttl = Duration::Seconds(300);
  // Terminal instance records kept for Watch/Cancel after they finish.
  size_t max_terminal_records = 10000;
  // Bound on each Submit binding value (symbol values such as S, C, B).
  int64_t max_binding_value = int64_t{1} << 20;
  // Threads for the scheduler's parallel what-if simulations.
  int scheduler_threads = 1;
  // Finished operator/transfer intervals kept for Timeline (>= 1).
  size_t timeline_capacity = 100000;
};

enum class ServingStateKind : uint8_t { kStarting, kServing, kDraining, kDrained };

// One state change of an instance (mirrors v1.InstanceEvent).
struct InstanceUpdate {
  InstanceState state = InstanceState::kPending;
  Timestamp time;
  uint32_t ops_done = 0;
  uint32_t ops_total = 0;
  std::vector<uint64_t> produced_checkpoints;  // DONE only
  std::string message;                          // FAILED / CANCELLED: why
};

inline bool IsTerminalInstanceState(InstanceState s) {
  return s == InstanceState::kDone || s == InstanceState::kFailed || s == InstanceState::kCancelled;
}

// The append-only event history of one instance, shared by the loop (the
// only writer) and any number of Watch streams. Thread-safe.
class InstanceRecord {
 public:
  explicit InstanceRecord(uint64_t id) : id_(id) {}
  uint64_t id() const { return id_; }
  void Append(InstanceUpdate update);
  // Closes the record without a terminal event (the master shut down).
  void Close();
  // Waits up to `timeout` for events with index >= `from`; returns them
  // (possibly none). `*closed` is set when no more events will come.
  std::vector<InstanceUpdate> WaitFrom(size_t from, absl::Duration timeout, bool* closed);
  InstanceUpdate Last();

 private:
  const uint64_t id_;
  absl::Mutex mu_;
  std::vector<InstanceUpdate> events_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

struct DeploymentInfo {
  DeploymentConfig spec;
  std::string prefill_template;
  std::string decode_template;
  std::string train_template;  // "<deployment>/train" (fine-tuning on this backbone)
  std::vector<std::pair<std::string, int>> partitions;  // enabled: name, slots
  int64_t weight_bytes = 0;
  int64_t kv_bytes_per_token = 0;
  int64_t created_unix_ms = 0;
  std::shared_ptr<const jobs::Tokenizer> tokenizer;  // spec.tokenizer loaded; null without one
};

struct SubmitArgs {
  std::string template_name;
  std::vector<std::pair<std::string, int64_t>> bindings;
  PriorityClass priority_class = PriorityClass::kOnline;
  int32_t priority = 0;
  uint32_t deadline_ms = 0;  // 0 = none
  std::vector<std::pair<std::string, uint64_t>> checkpoints;
  std::string label;
};

// One fine-tuning micro-batch: an instance of the deployment's
// "<deployment>/train" template (gmg/llama.h) whose kernels read and update
// `job` (executor/kernels/llama_kernels.h: forward, loss, backward, and the
// optimizer step every job->accumulation micro-batches). Offline class, so
// online serving keeps priority; `devices` (non-empty) bounds where its
// operators may run (InstanceSpec::allowed_devices).
// Spatial joint training: `partners` are the other jobs of one joint step
// (slots 1..; llama_kernels.h), `batch` mixes the rows of all of them
// (row_task over {job, partners...}), `rows` and `head_outputs` are summed
// over the slots; the instance binds T = 1 + partners.size().
struct TrainStepArgs {
  std::string deployment;
  std::shared_ptr<executor::LlamaTrainJob> job;
  std::shared_ptr<const executor::TrainBatch> batch;  // one task, row_task empty (joint: mixed)
  std::vector<std::shared_ptr<executor::LlamaTrainJob>> partners;  // joint step only
  int64_t rows = 0;          // B
  int64_t tokens = 0;        // S
  int64_t rank = 0;          // R (the job's LoRA rank)
  int64_t head_outputs = 0;  // NC
  std::vector<uint32_t> devices;
  int32_t priority = 0;
  std::string label;
  // -1: accumulated when it ends (one stream). >= 0: the job's global
  // micro-batch number; micro-batches of one iteration may then run
  // concurrently and are accumulated in this order (llama_kernels.h).
  // Single-job steps only: InvalidArgument together with `partners`.
  int64_t micro_index = -1;
};

// Generate requests whose client_tag starts with this are batch jobs' work
// (server/batch_runner.h); their device time is counted apart (metrics).
inline constexpr std::string_view kBatchClientTagPrefix = "batch ";

struct GenerateArgs {
  std::string deployment;
  std::vector<int64_t> prompt;  // token ids, at least one, each < vocab
  uint32_t max_tokens = 1;      // >= 1
  double temperature = 0;       // 0: greedy
  double top_p = 1;             // 0 or 1: no nucleus cut
  int64_t top_k = 0;            // 0: no top-k cut
  uint64_t seed = 0;            // 0: derived from the request id
  std::optional<PriorityClass> priority_class;  // unset: the deployment's role
  int32_t priority = 0;
  uint32_t ttft_ms = 0;         // SLO of the first token (0 = none)
  uint32_t deadline_ms = 0;     // SLO of the whole request (0 = none)
  std::vector<int64_t> stop_tokens;
  std::string client_tag;
};

enum class GenerationEnd : uint8_t { kNone, kLength, kStop, kCancelled, kError };

struct GeneratedToken {
  int64_t token = 0;
  uint32_t index = 0;
  Timestamp time;             // when it was known to the master
  double queue_ms = 0;        // index 0 only: arrival -> first op start
  GenerationEnd end = GenerationEnd::kNone;  // set on the last token only
};

// The token stream of one Generate request. The loop appends; any number of
// readers wait. Thread-safe.
class GenerationRecord {
 public:
  GenerationRecord(uint64_t id, Timestamp arrival) : id_(id), arrival_(arrival) {}
  uint64_t id() const { return id_; }
  Timestamp arrival() const { return arrival_; }
  void Append(GeneratedToken t);
  // Ends the stream without a further token (failure before a token, cancel
  // or shutdown): `end` and `message` say why.
  void Finish(GenerationEnd end, std::string message);
  // Waits up to `timeout` for tokens with index >= `from`. `*done` is set
  // once no more tokens will come; then `*end`/`*message` say how it ended.
  std::vector<GeneratedToken> WaitFrom(size_t from, absl::Duration timeout, bool* done, GenerationEnd* end,
                                       std::string* message);
  // Calls `fn` once the request has ended: at once (on this thread) when it
  // already has, else on the thread that ends it, after the record is
  // updated. One callback per record; keep it short (it runs on the loop).
  void OnDone(std::function<void()> fn);

 private:
  const uint64_t id_;
  const Timestamp arrival_;
  absl::Mutex mu_;
  std::vector<GeneratedToken> tokens_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  GenerationEnd end_ ABSL_GUARDED_BY(mu_) = GenerationEnd::kNone;
  std::string message_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_done_ ABSL_GUARDED_BY(mu_);
};

struct SubmitResult {
  uint64_t instance_id = 0;
  Timestamp arrival;
};

struct MasterStatus {
  std::string version;
  ServingStateKind state = ServingStateKind::kStarting;
  int64_t started_unix_ms = 0;
  int64_t uptime_ms = 0;
  uint32_t num_devices = 0;
  std::vector<std::string> deployments;
  uint64_t live_instances = 0;
  uint64_t queued_online = 0;   // live instances with no operator issued yet
  uint64_t queued_offline = 0;
  std::string policy;
  std::string backend;          // what actually executes, e.g. "virtual"
  std::string state_dir;
  // The runtime calibration, and per device (by id) its name, the operators
  // completed on it since start and their measured time.
  CalibrationView calibration;
  struct DeviceActivity {
    std::string name;
    uint64_t operators = 0;
    double busy_seconds = 0;
  };
  std::vector<DeviceActivity> device_activity;
};

struct DeviceInfo {
  DeviceSpec spec;
  std::string backend_used;  // "virtual" or "virtual (configured: cpu)"
  DeviceMemory memory;
  uint32_t queue_length = 0;
  uint64_t running_node = 0;
  double busy_fraction = 0;          // over the last minute (or since start)
  double busy_fraction_offline = 0;  // the part of it spent on offline instances
};

// A consistent GMG picture: the snapshot plus the names it refers to.
struct GmgView {
  GmgSnapshot snapshot;
  std::vector<DeviceInfo> devices;
  std::vector<std::string> template_names;  // indexed by template id value
  struct InstanceExtra {
    std::string state;
    std::string label;
  };
  std::vector<InstanceExtra> instances;  // parallel to snapshot.instances
  struct NodeExtra {
    std::string op;    // template op name, or "transfer"
    std::string kind;  // OpKindName
    Timestamp end = Timestamp::Never();
    Timestamp predicted_start = Timestamp::Never();
  };
  std::vector<NodeExtra> nodes;  // parallel to snapshot.nodes
};

struct EstimatorView {
  std::vector<OpEstimator::KeyStats> ops;
  std::vector<TransferEstimator::PairStats> transfers;
};

// Timeline(): the intervals and what is needed to render them.
struct TimelineView {
  TimelineResult result;
  std::vector<std::string> device_names;  // by device id
  Timestamp now;                          // the daemon's steady clock
};

struct DrainResult {
  ServingStateKind state = ServingStateKind::kDraining;
  uint64_t remaining_instances = 0;
};

class Master {
 public:
  // Opens the state store in config.state_dir, builds the backend, restores
  // estimators and deployments, registers the config's deployments and
  // starts the loop. Fails (without leaving threads behind) on a config the
  // daemon cannot serve.
  static absl::StatusOr<std::unique_ptr<Master>> Start(SlicedConfig config, MasterOptions options = {});

  Master(const Master&) = delete;
  Master& operator=(const Master&) = delete;
  // Shutdown().
  ~Master();

  // Stops the loop (in-flight instances are abandoned, watchers closed) and
  // saves the estimators. Idempotent.
  void Shutdown();

  const SlicedConfig& config() const { return config_; }
  const std::string& backend_name() const { return backend_name_; }

  // --- Serving ---------------------------------------------------------------
  // Validates and registers; persists it. AlreadyExists without `replace`.
  absl::StatusOr<DeploymentInfo> RegisterDeployment(DeploymentConfig spec, bool replace);
  absl::StatusOr<std::vector<DeploymentInfo>> ListDeployments();
  absl::StatusOr<SubmitResult> Submit(SubmitArgs args);
  // The record of a live or recently finished instance; NotFound otherwise.
  absl::StatusOr<std::shared_ptr<InstanceRecord>> FindInstance(uint64_t instance_id);
  // The state after the call (CANCELLED, or the terminal state it reached).
  absl::StatusOr<InstanceState> Cancel(uint64_t instance_id);
  // Admits one generation request (see "Generate" above); its tokens arrive
  // on the returned record. FailedPrecondition on a backend without
  // tokens; InvalidArgument / NotFound / ResourceExhausted name the field.
  absl::StatusOr<std::shared_ptr<GenerationRecord>> Generate(GenerateArgs args);
  // Cancels a running generation (a client went away): its current step is
  // cancelled and its KV cache freed. Unknown or finished ids are a no-op.
  absl::Status CancelGeneration(uint64_t request_id);
  // Live generation requests.
  absl::StatusOr<size_t> LiveGenerations();

  // --- Fine-tuning (the job runner, server/job_runner.h) ---------------------
  // Admits one training micro-batch (see TrainStepArgs); its progress and end
  // arrive on the returned record like any instance's. FailedPrecondition on
  // a backend without real operators (virtual devices, or no LibTorch);
  // NotFound for an unknown deployment; InvalidArgument naming the field.
  absl::StatusOr<std::shared_ptr<InstanceRecord>> SubmitTrainStep(TrainStepArgs args);
  // The resident backbone weights of a deployment (shared with its
  // operators; for evaluation). FailedPrecondition / NotFound as above.
  absl::StatusOr<std::shared_ptr<const executor::LlamaWeights>> BackboneWeights(const std::string& deployment);

  // --- Admin -----------------------------------------------------------------
  absl::StatusOr<MasterStatus> Status();
  absl::StatusOr<std::vector<DeviceInfo>> Devices();
  absl::StatusOr<GmgView> DumpGmg();
  absl::StatusOr<EstimatorView> Estimators();
  // Stops admitting (Submit/RegisterDeployment give FailedPrecondition).
  // With `wait`, waits up to `timeout` for the live instances to finish;
  // when none is left the state is DRAINED and the estimators are saved.
  absl::StatusOr<DrainResult> Drain(bool wait, absl::Duration timeout);
  bool draining() const { return draining_.load(); }
  // Saves the estimators now (also done periodically by the loop).
  absl::Status SaveEstimators();

  // --- Observability ---------------------------------------------------------
  // Finished operators and transfers (the last options.timeline_capacity)
  // plus the running ones, overlapping [since, until] of the daemon's steady
  // clock (Timestamp::Never() / Infinite() = unbounded; until is clamped to
  // now), at most `max_events` (>= 1, the latest starts kept). See
  // server/timeline.h for what "predicted" means.
  absl::StatusOr<TimelineView> Timeline(Timestamp since, Timestamp until, size_t max_events);
  // The counters and gauges of server/metrics.h, read on the loop (device,
  // status and the rest in three consecutive visits, so gauges of different
  // groups may be a loop iteration apart).
  absl::StatusOr<MetricsSnapshot> Metrics();

 private:
  struct Impl;  // everything the loop owns (GMG, scheduler, backend, ...)

  Master(SlicedConfig config, MasterOptions options);
  // Runs `fn` on the loop thread and waits for it. Unavailable once stopped.
  absl::Status RunOnLoop(std::function<void()> fn);
  // RegisterDeployment's work on the loop thread, with the tokenizer it
  // read before.
  absl::StatusOr<DeploymentInfo> RegisterDeploymentOnLoop(const DeploymentConfig& spec, bool replace,
                                                          const std::shared_ptr<const jobs::Tokenizer>& tokenizer);
  void Loop();
  // Loop's steps, in the order it runs them. The wait for work (commands,
  // a backend event, the backend's next event or 50 ms) and what it took:
  // the queued commands and whether the master stops.
  struct LoopWake {
    std::deque<std::function<void()>> commands;
    bool stop = false;
  };
  LoopWake AwaitWork();
  // The backend's completions up to `now`: estimators, timeline and busy
  // counters.
  void ApplyFeedback(Timestamp now);
  // Instances the GMG retired: their final state to their records.
  void ReportRetired(Timestamp now);
  // The live instances' progress to their records.
  void ReportProgress(Timestamp now);
  // Releases the retained checkpoints unused for checkpoint_ttl.
  void ReleaseExpiredCheckpoints(Timestamp now);
  // One busy sample a second for Devices, a minute's worth.
  void SampleBusy(Timestamp now);
  // The executors' event notifier (any thread; see the lock order in
  // AwaitWork).
  void NotifyBackendEvent();
  // Loop: a step of generation `request` retired: emit its token, start the
  // next step or end the request.
  void StepRetired(uint64_t request, const RetiredInstance& r, Timestamp now);

  // Observability hooks of the loop (loop thread only; master.cc
  // "Observability").
  // A completion as a timeline interval, with the estimators' prediction
  // (call before the learner applies it); `*class_known` is false when its
  // instance already left the GMG (retired in this iteration).
  TimelineEntry TimelineEntryOf(const Feedback& f, bool* class_known);
  // The estimators' prediction of an operator (tpl/op/attrs) or a transfer
  // (dst valid, bytes) on `device`, in ns, as OnlineLearner scores it.
  double PredictedNs(bool transfer, DeviceId device, DeviceId dst, TemplateId tpl, int op,
                     std::span<const int64_t> attrs, Bytes bytes, bool overlapped);
  void ObserveRetired(const RetiredInstance& r);
  // Moves this iteration's completions into the timeline ring.
  void FlushTimeline();
  void ObserveSchedule(const ScheduleStats* stats, std::chrono::steady_clock::duration took);

  const SlicedConfig config_;
  const MasterOptions options_;
  std::string backend_name_;
  SteadyClock clock_;
  int64_t started_unix_ms_ = 0;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> draining_{false};
  // Set by the executors' event notifier (under mu_) to wake the loop.
  bool backend_event_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex mu_;
  std::deque<std::function<void()>> commands_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::thread loop_;
  absl::Mutex shutdown_mu_;
};

absl::string_view ServingStateName(ServingStateKind s);

}  // namespace slicesched
