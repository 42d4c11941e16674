// The daemon's real backend on the LibTorch executors (server/extensions.h):
// an adapter from the master's requests to LlamaServingBackend, registered
// with the daemon. In the LibTorch library sliced_torch; a torch-free TU.
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/kernels/llama_kernels.h"
#include "slicesched/executor/kernels/llama_serving.h"
#include "slicesched/executor/train/train_ops.h"
#include "slicesched/server/extensions.h"
#include "slicesched/server/master.h"

namespace slicesched {
namespace {

class TorchRealBackend final : public RealBackend {
 public:
  explicit TorchRealBackend(std::unique_ptr<executor::LlamaServingBackend> serving) : serving_(std::move(serving)) {}

  executor::ExecutorSet& executors() override { return serving_->executors(); }

  absl::Status AddModel(const LlamaDims& dims, const WeightsConfig& weights) override {
    executor::LlamaWeightsSource source;
    if (weights.kind == WeightsConfig::Kind::kSafetensors) source.safetensors_path = weights.safetensors_path;
    source.seed = weights.seed;
    return serving_->AddModel(dims, source);
  }

  absl::Status SetRequest(const std::string& deployment, InstanceId inst, const std::vector<int64_t>& tokens,
                          int64_t batch, double temperature, double top_p, uint64_t seed, int64_t top_k) override {
    const executor::SamplingParams sampling{.temperature = temperature, .top_p = top_p, .seed = seed, .top_k = top_k};
    return serving_->SetRequest(deployment, inst, tokens, batch, sampling);
  }

  void EraseRequest(InstanceId inst) override { serving_->EraseRequest(inst); }

  std::optional<std::vector<int64_t>> TakeTokens(InstanceId inst) override { return serving_->TakeTokens(inst); }

  absl::Status SetTrainRequest(const TrainStepArgs& args, InstanceId inst) override {
    return serving_->SetTrainRequest(args.deployment, inst,
                                     executor::LlamaTrainRequest{.job = args.job,
                                                                 .batch = *args.batch,
                                                                 .micro_index = args.micro_index,
                                                                 .partners = args.partners});
  }

  std::shared_ptr<const executor::LlamaWeights> Weights(const std::string& deployment) override {
    return serving_->Weights(deployment);
  }

 private:
  std::unique_ptr<executor::LlamaServingBackend> serving_;
};

absl::StatusOr<std::unique_ptr<RealBackend>> CreateTorchRealBackend(GlobalMappingGraph* gmg, const Clock* clock,
                                                                    const executor::ExecutorOptions& options) {
  SLICESCHED_ASSIGN_OR_RETURN(std::unique_ptr<executor::LlamaServingBackend> serving,
                              executor::LlamaServingBackend::Create(gmg, clock, options));
  return std::unique_ptr<RealBackend>(std::make_unique<TorchRealBackend>(std::move(serving)));
}

absl::Status CheckTrainStep(const TrainStepArgs& args) {
  if (!args.partners.empty() && args.batch->row_task.size() != static_cast<size_t>(args.rows)) {
    return absl::InvalidArgumentError(StrCat("batch.row_task: a joint step needs one task index per row (",
                                             args.batch->row_task.size(), " for ", args.rows, " rows)"));
  }
  return absl::OkStatus();
}

[[maybe_unused]] const bool kRegistered =
    RegisterRealBackend({.create = &CreateTorchRealBackend, .check_train_step = &CheckTrainStep});

}  // namespace
}  // namespace slicesched
