// Torch-free: uses only the public operator API (llama_ops.h, llama_kernels.h).
#include "slicesched/executor/kernels/llama_serving.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

namespace slicesched::executor {

SamplingParams SamplingForStep(const SamplingParams& base, int step) {
  SamplingParams p = base;
  p.seed = base.seed + static_cast<uint64_t>(step);
  return p;
}

absl::Status CheckGenerateDirect(const std::vector<int64_t>& prompt, int max_tokens, const SamplingParams& base) {
  if (prompt.empty()) return absl::InvalidArgumentError("prompt: at least one token is required");
  if (max_tokens < 1) return absl::InvalidArgumentError(StrCat("max_tokens must be at least 1, got '", max_tokens, "'"));
  if (!(base.temperature >= 0) || !std::isfinite(base.temperature)) {
    return absl::InvalidArgumentError(StrCat("temperature must be finite and at least 0, got '", base.temperature, "'"));
  }
  if (!(base.top_p >= 0 && base.top_p <= 1)) {
    return absl::InvalidArgumentError(StrCat("top_p must be in [0, 1], got '", base.top_p, "'"));
  }
  if (base.top_k < 0) return absl::InvalidArgumentError(StrCat("top_k must be at least 0, got '", base.top_k, "'"));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> GenerateDirect(const LlamaWeights& weights, const std::vector<int64_t>& prompt,
                                                    int max_tokens, const SamplingParams& base,
                                                    const std::vector<int64_t>& stop_tokens) {
  SLICESCHED_RETURN_IF_ERROR(CheckGenerateDirect(prompt, max_tokens, base));
  // One core, as on the executors' device threads (LlamaKernelRunner::Run):
  // a matmul split over more threads sums in another order, and a sampled
  // token whose probability sits at a draw's edge can then differ.
  SetIntraOpThreadsForThisThread(1);
  std::vector<KvCache> caches(static_cast<size_t>(weights.num_groups()));
  std::vector<int64_t> out;
  Tensor tokens = Tensor::FromInt64(prompt, {1, static_cast<int64_t>(prompt.size())});
  int64_t pos = 0;
  for (int step = 0; step < max_tokens; ++step) {
    SLICESCHED_ASSIGN_OR_RETURN(Tensor x, Embedding(weights, tokens));
    for (int64_t g = 0; g < weights.num_groups(); ++g) {
      SLICESCHED_ASSIGN_OR_RETURN(x, FusedLayers(weights, g, x, &caches[static_cast<size_t>(g)], pos));
    }
    pos += tokens.shape()[1];
    SLICESCHED_ASSIGN_OR_RETURN(Tensor logits, LmHead(weights, x));
    SLICESCHED_ASSIGN_OR_RETURN(Tensor sampled, Sample(logits, SamplingForStep(base, step)));
    const int64_t tok = sampled.ToInt64().at(0);
    out.push_back(tok);
    if (std::find(stop_tokens.begin(), stop_tokens.end(), tok) != stop_tokens.end()) break;
    const std::vector<int64_t> next = {tok};
    tokens = Tensor::FromInt64(next, {1, 1});
  }
  return out;
}

namespace {

// Where each device of the cluster runs its operators: the CPU, or the CUDA
// ordinal of a 'cuda' device, which this process must be able to use.
absl::StatusOr<std::vector<TensorDevice>> Placement(const GlobalMappingGraph& gmg) {
  std::vector<TensorDevice> out;
  for (size_t d = 0; d < gmg.accelerators().size(); ++d) {
    const DeviceSpec& spec = gmg.accelerators().device(DeviceId(static_cast<uint16_t>(d)));
    if (spec.backend != DeviceBackend::kCuda) {
      out.push_back(TensorDevice::Cpu());
      continue;
    }
    if (absl::Status usable = CheckCudaDevice(spec.ordinal); !usable.ok()) {
      return Annotate(usable, StrCat("device '", spec.name, "' (backend cuda, device ", spec.ordinal, ")"));
    }
    out.push_back(TensorDevice::Cuda(spec.ordinal));
  }
  return out;
}

}  // namespace

// Routes each kernel call to the runner of the deployment that owns the
// call's template ("<deployment>/<kind>").
class LlamaServingBackend::Router final : public KernelRunner {
 public:
  absl::Status Run(const KernelCall& call) override {
    if (call.tpl == nullptr) return absl::InvalidArgumentError(StrCat("kernel call for node ", call.node, " has no template"));
    std::shared_ptr<LlamaKernelRunner> runner = Find(DeploymentOf(call.tpl->name()));
    if (runner == nullptr) {
      return absl::FailedPreconditionError(
          StrCat("template '", call.tpl->name(), "' belongs to no deployment with loaded weights"));
    }
    return runner->Run(call);
  }

  static std::string DeploymentOf(const std::string& template_name) {
    const size_t slash = template_name.rfind('/');
    return slash == std::string::npos ? template_name : template_name.substr(0, slash);
  }

  std::shared_ptr<LlamaKernelRunner> Find(const std::string& deployment) const {
    absl::MutexLock l(&mu_);
    auto it = runners_.find(deployment);
    return it == runners_.end() ? nullptr : it->second;
  }
  std::vector<std::shared_ptr<LlamaKernelRunner>> All() const {
    absl::MutexLock l(&mu_);
    std::vector<std::shared_ptr<LlamaKernelRunner>> out;
    for (const auto& [name, runner] : runners_) out.push_back(runner);
    return out;
  }
  void Put(const std::string& deployment, std::shared_ptr<LlamaKernelRunner> runner) {
    absl::MutexLock l(&mu_);
    runners_[deployment] = std::move(runner);
  }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<LlamaKernelRunner>> runners_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<LlamaServingBackend>> LlamaServingBackend::Create(GlobalMappingGraph* gmg,
                                                                               const Clock* clock,
                                                                               ExecutorOptions options) {
  if (gmg == nullptr || clock == nullptr) return absl::InvalidArgumentError("LlamaServingBackend needs a GMG and a clock");
  std::unique_ptr<LlamaServingBackend> b(new LlamaServingBackend());
  b->router_ = std::make_unique<Router>();
  SLICESCHED_ASSIGN_OR_RETURN(b->placement_, Placement(*gmg));
  b->transfers_.Place(b->placement_);
  for (const TensorDevice& d : b->placement_) {
    if (d.is_cuda()) b->baseline_[d.index];  // the GPUs to reconcile
  }
  SLICESCHED_RETURN_IF_ERROR(b->RebaselineMemory());
  b->executors_ = std::make_unique<ExecutorSet>(gmg, clock, b->router_.get(), &b->transfers_, std::move(options));
  return b;
}

LlamaServingBackend::~LlamaServingBackend() { executors_.reset(); }

absl::Status LlamaServingBackend::AddModel(const LlamaDims& dims, const LlamaWeightsSource& source) {
  absl::StatusOr<std::shared_ptr<const LlamaWeights>> weights =
      source.safetensors_path.empty() ? LlamaWeights::FromSeed(dims, source.seed)
                                      : LlamaWeights::FromSafetensors(dims, source.safetensors_path);
  if (!weights.ok()) return Annotate(weights.status(), StrCat("weights of deployment '", dims.name, "'"));
  SLICESCHED_ASSIGN_OR_RETURN(std::unique_ptr<LlamaKernelRunner> runner, LlamaKernelRunner::Create(*weights, dims));
  if (absl::Status placed = runner->Place(placement_); !placed.ok()) {
    return Annotate(placed, StrCat("weights of deployment '", dims.name, "'"));
  }
  runner->SetTokenSink([this](InstanceId instance, const Tensor& tokens) {
    std::vector<int64_t> ids = tokens.ToInt64();
    absl::MutexLock l(&mu_);
    tokens_[instance.value()] = std::move(ids);
  });
  router_->Put(dims.name, std::shared_ptr<LlamaKernelRunner>(std::move(runner)));
  return absl::OkStatus();
}

absl::StatusOr<std::map<int, MemoryReconciliation>> LlamaServingBackend::ReconcileMemory() const {
  std::map<int, DeviceMemoryAccount> ours;
  for (size_t d = 0; d < placement_.size(); ++d) {
    if (!placement_[d].is_cuda()) continue;
    ours[placement_[d].index].pool_bytes +=
        executors_->pool(DeviceId(static_cast<uint16_t>(d))).used().count();
  }
  for (auto& [ordinal, account] : ours) account.resident_bytes = ResidentOn(ordinal) - baseline_resident_.at(ordinal);
  std::map<int, MemoryReconciliation> out;
  for (const auto& [ordinal, account] : ours) {
    SLICESCHED_ASSIGN_OR_RETURN(const CudaAllocatorStats now, QueryCudaAllocator(ordinal));
    out[ordinal] = ReconcileDeviceMemory(account, now, baseline_.at(ordinal));
  }
  return out;
}

absl::Status LlamaServingBackend::RebaselineMemory() {
  for (auto& [ordinal, stats] : baseline_) {
    SLICESCHED_ASSIGN_OR_RETURN(stats, QueryCudaAllocator(ordinal));
    baseline_resident_[ordinal] = ResidentOn(ordinal);
  }
  return absl::OkStatus();
}

int64_t LlamaServingBackend::ResidentOn(int ordinal) const {
  int64_t bytes = 0;
  for (const auto& runner : router_->All()) bytes += runner->ResidentOn(ordinal).count();
  return bytes;
}

bool LlamaServingBackend::HasModel(const std::string& deployment) const { return router_->Find(deployment) != nullptr; }

absl::Status LlamaServingBackend::SetRequest(const std::string& deployment, InstanceId instance,
                                             const std::vector<int64_t>& tokens, int64_t batch,
                                             const SamplingParams& sampling) {
  std::shared_ptr<LlamaKernelRunner> runner = router_->Find(deployment);
  if (runner == nullptr) return absl::NotFoundError(StrCat("deployment '", deployment, "' has no loaded weights"));
  if (batch < 1 || tokens.empty() || tokens.size() % static_cast<size_t>(batch) != 0) {
    return absl::InvalidArgumentError(StrCat("request of instance ", instance, ": ", tokens.size(),
                                             " token ids do not form a batch of ", batch));
  }
  const int64_t vocab = runner->weights().dims().vocab;
  for (int64_t t : tokens) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(StrCat("request of instance ", instance, ": token id ", t,
                                               " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  const int64_t n = static_cast<int64_t>(tokens.size()) / batch;
  runner->SetRequest(instance, LlamaRequest{Tensor::FromInt64(tokens, {batch, n}), sampling});
  absl::MutexLock l(&mu_);
  request_owner_[instance.value()] = deployment;
  return absl::OkStatus();
}

absl::Status LlamaServingBackend::SetTrainRequest(const std::string& deployment, InstanceId instance,
                                                  LlamaTrainRequest request) {
  std::shared_ptr<LlamaKernelRunner> runner = router_->Find(deployment);
  if (runner == nullptr) return absl::NotFoundError(StrCat("deployment '", deployment, "' has no loaded weights"));
  if (request.job == nullptr) {
    return absl::InvalidArgumentError(StrCat("training request of instance ", instance, ": no job"));
  }
  runner->SetTrainRequest(instance, std::move(request));
  absl::MutexLock l(&mu_);
  request_owner_[instance.value()] = deployment;
  return absl::OkStatus();
}

std::shared_ptr<const LlamaWeights> LlamaServingBackend::Weights(const std::string& deployment) const {
  std::shared_ptr<LlamaKernelRunner> runner = router_->Find(deployment);
  if (runner == nullptr) return nullptr;
  return runner->shared_weights();
}

void LlamaServingBackend::EraseRequest(InstanceId instance) {
  std::string owner;
  {
    absl::MutexLock l(&mu_);
    auto it = request_owner_.find(instance.value());
    if (it != request_owner_.end()) {
      owner = std::move(it->second);
      request_owner_.erase(it);
    }
    tokens_.erase(instance.value());
  }
  if (owner.empty()) return;
  if (std::shared_ptr<LlamaKernelRunner> runner = router_->Find(owner)) runner->EraseRequest(instance);
}

std::optional<std::vector<int64_t>> LlamaServingBackend::TakeTokens(InstanceId instance) {
  absl::MutexLock l(&mu_);
  auto it = tokens_.find(instance.value());
  if (it == tokens_.end()) return std::nullopt;
  std::vector<int64_t> out = std::move(it->second);
  tokens_.erase(it);
  return out;
}

}  // namespace slicesched::executor
