// The daemon's LibTorch parts, as the daemon sees them: the real backend
// (devices with backend 'cpu' run the Llama operators on the executors) and
// the fine-tuning runner. Both need LibTorch, so they live in the library
// sliced_torch (src/server/CMakeLists.txt), which registers a factory for
// each here; a build without LibTorch registers none, and the daemon says
// what needs LibTorch instead of doing it: 'cpu' devices run on the virtual
// cluster, fine-tuning jobs are accepted and stay queued.
//
// The factories are registered by namespace-scope initialisers before main
// and read-only afterwards.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "slicesched/common/clock.h"
#include "slicesched/common/ids.h"
#include "slicesched/executor/runtime/executor.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/server/config.h"

namespace slicesched {

class Master;
struct TrainStepArgs;  // server/master.h
namespace jobs {
class JobManager;
}  // namespace jobs
namespace executor {
class LlamaWeights;  // executor/llama/llama_ops.h
}  // namespace executor

// --- The real backend ------------------------------------------------------

// What the master asks of the executors beyond ExecutionBackend: the models'
// weights, each Generate request's tokens and sampling, the training
// requests of fine-tuning steps.
class RealBackend {
 public:
  virtual ~RealBackend() = default;
  // The per-device executors (the ExecutionBackend the master drives).
  virtual executor::ExecutorSet& executors() = 0;
  virtual absl::Status AddModel(const LlamaDims& dims, const WeightsConfig& weights) = 0;
  virtual absl::Status SetRequest(const std::string& deployment, InstanceId inst, const std::vector<int64_t>& tokens,
                                  int64_t batch, double temperature, double top_p, uint64_t seed,
                                  int64_t top_k) = 0;
  virtual void EraseRequest(InstanceId inst) = 0;
  // The tokens instance `inst` sampled, once it finished; nullopt before.
  virtual std::optional<std::vector<int64_t>> TakeTokens(InstanceId inst) = 0;
  // Registers the training request of step instance `inst`.
  virtual absl::Status SetTrainRequest(const TrainStepArgs& args, InstanceId inst) = 0;
  // A deployment's loaded weights, or null.
  virtual std::shared_ptr<const executor::LlamaWeights> Weights(const std::string& deployment) = 0;
};

struct RealBackendRegistration {
  std::function<absl::StatusOr<std::unique_ptr<RealBackend>>(GlobalMappingGraph* gmg, const Clock* clock,
                                                             const executor::ExecutorOptions& options)>
      create;
  // The checks of a training step that need the complete batch (a joint
  // step's per-row task indices), made before the step is queued.
  std::function<absl::Status(const TrainStepArgs& args)> check_train_step;
};
bool RegisterRealBackend(RealBackendRegistration registration);
// The registered backend, or null in a build without LibTorch.
const RealBackendRegistration* RegisteredRealBackend();

// --- The fine-tuning runner ------------------------------------------------

struct JobRunnerOptions {
  PlannerConfig planner;
  std::string state_dir;  // checkpoints under STATE_DIR/jobs/<id>/
  // The clock of planning rounds, checkpoint intervals and prefetch; not
  // owned, must outlive the runner. Null: the runner's own SteadyClock.
  const Clock* clock = nullptr;
  // The seconds a timed span of job `job_id`'s training is taken to have
  // lasted: a profiling micro-batch or a wave (`waves` = 1), or a whole
  // iteration on one device count (`waves` = its waves), given `elapsed_s`,
  // the real time from its submit to its end. The planner's iteration times
  // come from these spans only (profiling, then the EMAs, the sync cost and
  // the time LUT; see server/job_runner.h, "JobView"). Null: the elapsed
  // time (the daemon). Tests give fixed durations, so that no planning
  // decision depends on the machine's load. The context switch's parts
  // (reported, never planned with) are always the elapsed times.
  std::function<double(uint64_t job_id, int64_t waves, double elapsed_s)> span_seconds;
  double default_iter_time_s = 0.05;
};

// The daemon's handle on the runner (server/job_runner.h).
class TrainingRunner {
 public:
  virtual ~TrainingRunner() = default;
  // Runs the runner's passes on a thread until Stop.
  virtual void Start() = 0;
  // Stops the thread, waits up to `timeout` for in-flight micro-batches and
  // checkpoints every running job. Idempotent.
  virtual void Stop(absl::Duration timeout) = 0;
  void Stop() { Stop(absl::Seconds(10)); }
};

using TrainingRunnerFactory =
    std::function<absl::StatusOr<std::unique_ptr<TrainingRunner>>(Master*, jobs::JobManager*, JobRunnerOptions)>;
bool RegisterTrainingRunner(TrainingRunnerFactory factory);
// The registered runner; FailedPrecondition naming LibTorch in a build
// without one.
absl::StatusOr<std::unique_ptr<TrainingRunner>> CreateTrainingRunner(Master* master, jobs::JobManager* jobs,
                                                                     JobRunnerOptions options);

}  // namespace slicesched
