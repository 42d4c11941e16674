// The master's state, owned by its loop thread (Master::Impl), and what the
// files of the master share: master.cc (construction and the loop),
// master_serving.cc (deployments, instances, Generate), master_training.cc
// (fine-tuning steps) and master_admin.cc (status, devices, the GMG dump,
// drain, timeline and metrics). Private to sliced_master.
#pragma once

#include "slicesched/server/master.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "slicesched/cluster/ground_truth.h"
#include "slicesched/cluster/virtual_cluster.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/common/thread_pool.h"
#include "slicesched/estimate/calibration.h"
#include "slicesched/estimate/estimators.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/sched/learner.h"
#include "slicesched/sched/slice_scheduler.h"
#include "slicesched/server/extensions.h"
#include "slicesched/sim/simulator.h"
#include "spdlog/spdlog.h"

namespace slicesched {

// ---------------------------------------------------------------------------
// Impl: everything owned by the loop thread
// ---------------------------------------------------------------------------

namespace master_internal {

inline bool ValidDeploymentName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

inline bool SameModel(const LlamaDims& a, const LlamaDims& b) {
  return a.layers == b.layers && a.hidden == b.hidden && a.heads == b.heads && a.kv_heads == b.kv_heads &&
         a.ffn == b.ffn && a.vocab == b.vocab && a.dtype == b.dtype && a.fusion == b.fusion;
}

// Calibration log lines (see the header).
constexpr double kCalibrationLogChange = 0.10;
constexpr Duration kCalibrationLogInterval = Duration::Seconds(1);

inline int64_t UnixMillisNow() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace master_internal

// What the loop accumulates for Timeline and Metrics (owned by the loop).
struct MasterObserved {
  explicit MasterObserved(size_t timeline_capacity) : timeline(timeline_capacity) {}
  TimelineRing timeline;
  // This iteration's completions; entries whose instance already left the
  // GMG get their class from the retirements of the same iteration.
  std::vector<std::pair<TimelineEntry, bool>> pending;  // entry, class known
  absl::flat_hash_map<uint64_t, PriorityClass> retired_class;
  MetricsSnapshot::ClassStats classes[2];
  uint64_t slo_total = 0;
  uint64_t slo_met = 0;
  Histogram schedule_call = Histogram::DecisionSeconds();
  Histogram schedule_round = Histogram::DecisionSeconds();
  uint64_t schedule_rounds = 0;
  uint64_t whatif_runs = 0;
  uint64_t issued_nodes = 0;
  uint64_t simulated_ops = 0;
  double whatif_seconds = 0;
};

struct Master::Impl {
  struct Tracked {
    InstanceId id;
    std::shared_ptr<InstanceRecord> record;
    InstanceState state = InstanceState::kPending;
    uint32_t ops_done = 0;
    uint32_t ops_total = 0;
  };
  struct BusySample {
    Timestamp time;
    std::vector<int64_t> busy_ns;
    std::vector<int64_t> busy_offline_ns;
  };
  // One Generate request between its steps (see the header).
  struct Generation {
    uint64_t id = 0;
    std::string deployment;
    TemplateId decode_tpl;
    GenerateArgs args;
    PriorityClass cls = PriorityClass::kOnline;
    std::shared_ptr<GenerationRecord> record;
    InstanceId current;             // the step now in the GMG
    std::vector<CheckpointId> kv;   // from the prefill, one per fused group
    uint32_t produced = 0;
    bool cancel_requested = false;
    Timestamp first_start = Timestamp::Never();
  };

  Impl(const SlicedConfig& config, const MasterOptions& options)
      : gmg(config.cluster),
        truth(gmg.accelerators(), GroundTruthOptions{}),
        cluster(&gmg, &truth, /*seed=*/1),
        transfers(gmg.accelerators()),
        calibration(gmg.accelerators()),
        ctx(&gmg.templates(), &ops, &transfers),
        learner(&gmg, &ctx, &ops, &transfers, &calibration),
        pool(std::max(1, options.scheduler_threads)),
        scheduler(SliceSchedulerOptions{.volume = config.scheduler.volume,
                                        .timeliness = config.scheduler.timeliness,
                                        .offline_queue_limit = static_cast<int>(config.scheduler.offline_queue_limit),
                                        .offline_avoids_online_streams =
                                            config.scheduler.offline_avoids_online_streams,
                                        .stream_idle_after = config.scheduler.stream_idle_after,
                                        .offline_aging = config.scheduler.offline_aging,
                                        .online_new_device_cost = config.scheduler.online_new_device_cost,
                                        .online_stream_device_cost = config.scheduler.online_stream_device_cost,
                                        .prefill_chunk_tokens = config.scheduler.prefill_chunk_tokens,
                                        .offline_prefill_chunk_tokens =
                                            config.scheduler.offline_prefill_chunk_tokens,
                                        .pipeline_online_prefill = config.scheduler.pipeline_online_prefill}),
        env{&gmg, &cluster, &ctx, &pool} {
    ctx.set_calibration(&calibration);
  }

  GlobalMappingGraph gmg;
  GroundTruthModel truth;
  VirtualCluster cluster;
  OpEstimator ops;
  TransferEstimator transfers;
  RuntimeCalibration calibration;
  SimContext ctx;
  OnlineLearner learner;
  ThreadPool pool;
  SliceScheduler scheduler;
  SchedulerEnv env;

  std::map<std::string, DeploymentInfo> deployments;
  absl::flat_hash_map<std::string, std::string> template_owner;  // template name -> deployment
  absl::flat_hash_map<uint64_t, Tracked> live;                    // by instance id
  absl::flat_hash_map<uint64_t, std::shared_ptr<InstanceRecord>> finished;
  std::deque<uint64_t> finished_order;
  absl::flat_hash_map<uint64_t, Timestamp> checkpoint_used;  // retained checkpoint -> last use
  std::deque<BusySample> busy_samples;
  std::vector<int64_t> busy_ns;          // per device: measured operator time so far
  std::vector<int64_t> busy_offline_ns;  // the part of it spent on offline instances
  std::vector<int64_t> busy_batch_ns;    // ... on batch jobs' requests (client tag "batch ...")
  std::vector<uint64_t> ops_done;        // per device: operators completed so far
  // Calibration log lines (see the header): per factor (devices, then the
  // overlap and transfer-overlap factors) the value last logged and when.
  std::vector<double> logged_factor;
  std::vector<Timestamp> logged_at;
  struct UnclassifiedBusy {
    uint64_t instance;
    uint16_t device;
    int64_t ns;
  };
  std::vector<UnclassifiedBusy> busy_unclassified;  // this iteration's, class resolved at retirement
  Timestamp last_save;
  std::vector<Feedback> feedback;

  // The backend the loop drives: &cluster, or the LibTorch executors.
  ExecutionBackend* backend = &cluster;
  bool has_tokens = false;  // the backend runs real operators (Generate works)
  // The real backend (server/extensions.h), when the devices have one.
  std::unique_ptr<RealBackend> real;
  // The loop's sleep, told to the LibTorch executors (no-ops otherwise).
  void OwnerSleeps() {
    if (real != nullptr) real->executors().OwnerSleeps();
  }
  void OwnerAwake() {
    if (real != nullptr) real->executors().OwnerAwake();
  }
  absl::flat_hash_map<uint64_t, Generation> generations;  // by request id
  absl::flat_hash_map<uint64_t, uint64_t> step_owner;     // instance -> request id
  uint64_t next_request_id = 1;

  // ---- the real backend's request table (no-ops on the virtual cluster) ----
  absl::Status AddModel(const LlamaDims& dims, const WeightsConfig& w) {
    return real != nullptr ? real->AddModel(dims, w) : absl::OkStatus();
  }
  absl::Status SetRequest(const std::string& deployment, InstanceId inst, const std::vector<int64_t>& tokens,
                          int64_t batch, double temperature, double top_p, uint64_t seed, int64_t top_k = 0) {
    return real != nullptr ? real->SetRequest(deployment, inst, tokens, batch, temperature, top_p, seed, top_k)
                           : absl::OkStatus();
  }
  void EraseRequest(InstanceId inst) {
    if (real != nullptr) real->EraseRequest(inst);
  }
  std::optional<std::vector<int64_t>> TakeTokens(InstanceId inst) {
    return real != nullptr ? real->TakeTokens(inst) : std::nullopt;
  }

  void ReleaseKv(Generation& g) {
    for (CheckpointId c : g.kv) {
      checkpoint_used.erase(c.value());
      if (gmg.FindCheckpoint(c) != nullptr) {
        const absl::Status s = gmg.ReleaseCheckpoint(c);
        if (!s.ok()) spdlog::warn("generation {}: releasing KV checkpoint {}: {}", g.id, c.value(), s.ToString());
      }
    }
    g.kv.clear();
  }
  std::unique_ptr<MasterObserved> obs;  // Timeline and Metrics

  // What the StateStore keeps of the learned models ("op", "transfer",
  // "calibration").
  std::vector<EstimatorSnapshot> LearnedState() const {
    return {{.kind = "op", .text = ops.Save()},
            {.kind = "transfer", .text = transfers.Save()},
            {.kind = "calibration", .text = calibration.Save()}};
  }

  // One log line per calibration factor that moved (see the header). Runs
  // every loop iteration with feedback: reads the factors only, builds a
  // line only for one that moved.
  void LogCalibration(Timestamp now) {
    const size_t nd = calibration.num_devices();
    if (logged_factor.empty()) {
      logged_factor.assign(nd + 2, 1.0);  // the devices, overlap, transfer overlap
      logged_at.assign(nd + 2, Timestamp::Never());
    }
    for (size_t i = 0; i < nd + 2; ++i) {
      const double factor = i < nd    ? calibration.device_factor(DeviceId(static_cast<uint16_t>(i)))
                            : i == nd ? calibration.overlap_factor()
                                      : calibration.transfer_overlap_factor();
      if (std::abs(factor / logged_factor[i] - 1.0) <= master_internal::kCalibrationLogChange) continue;
      if (logged_at[i] != Timestamp::Never() && now - logged_at[i] < master_internal::kCalibrationLogInterval) continue;
      const CalibrationView v = calibration.View();
      const CalibrationFactorView& f = i < nd ? v.devices[i] : i == nd ? v.overlap : v.transfer_overlap;
      const std::string name =
          i < nd ? StrCat("device ", gmg.accelerators().device(DeviceId(static_cast<uint16_t>(i))).name, " speed")
                 : std::string(i == nd ? "overlap" : "transfer overlap");
      // A device's factor is its relative one times its type's drift.
      spdlog::info("calibration: {} factor {:.3f} -> {:.3f} ({}raw {:.3f}, weight {:.3f}, {} samples{})", name,
                   logged_factor[i], factor,
                   i < nd ? absl::StrFormat("relative %.3f, drift %.3f, ", f.factor, v.drift[i].factor) : "",
                   f.raw, f.weight, f.samples, i < nd ? StrCat(", ", ops_done[i], " ops on it") : "");
      logged_factor[i] = factor;
      logged_at[i] = now;
    }
  }
};

}  // namespace slicesched
