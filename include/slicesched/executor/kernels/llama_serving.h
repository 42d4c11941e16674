// The real execution backend of the `sliced` daemon: every device of the
// cluster is a CPU executor thread (ExecutorSet) running the LibTorch Llama
// operators of any number of deployments.
//
// One LlamaServingBackend owns
//   - the ExecutorSet (one thread per device, shared queue discipline,
//     Recv-before-Send transfers) that the master drives as its
//     ExecutionBackend,
//   - one LlamaKernelRunner per deployment (its own weights), reached
//     through a router that picks the runner by the template of the call:
//     "<deployment>/prefill" and "<deployment>/decode" belong to deployment
//     <deployment> (gmg/llama.h names them so),
//   - the Llama transfer backend (payloads shared or copied between CPU
//     devices),
//   - the training requests of "<deployment>/train" instances
//     (SetTrainRequest: the fine-tuning job's shared state and micro-batch),
//   - the sampled tokens: the sample op of each instance reports its token
//     ids, which the master takes once the instance is DONE (TakeTokens).
//
// Requests: an instance's embedding reads its $tokens from the request set
// with SetRequest (before the instance's first op can run) and erased with
// EraseRequest once it retired.
//
// Threading: AddModel, SetRequest, EraseRequest and TakeTokens are
// thread-safe; the ExecutorSet has one owner thread (the master's loop; see
// executor.h). This header is LibTorch-free.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "slicesched/common/clock.h"
#include "slicesched/common/ids.h"
#include "slicesched/executor/runtime/executor.h"
#include "slicesched/executor/kernels/llama_kernels.h"
#include "slicesched/executor/torch/device.h"
#include "slicesched/gmg/gmg.h"
#include "slicesched/gmg/llama.h"

namespace slicesched::executor {

// Where a deployment's weights come from.
struct LlamaWeightsSource {
  std::string safetensors_path;  // non-empty: load this file (HF names)
  uint64_t seed = 0;             // otherwise: deterministic random weights
};

// Sampling of one request step (see llama_ops.h Sample); the seed of step k
// of a generation is seed + k, so a request is reproducible from its seed.
SamplingParams SamplingForStep(const SamplingParams& base, int step);

// What a Generate request computes, without the scheduler: the operators
// called directly in a loop (one KvCache per fused group), step k sampling
// with SamplingForStep(base, k), until `max_tokens` tokens or a stop token
// (included). Tests and `slicesim generate-direct` compare the daemon's
// streams with it.
// GenerateDirect's argument checks, before any work: InvalidArgument naming
// the argument and its value (a non-empty prompt, max_tokens >= 1, the
// sampling parameters Sample accepts: temperature finite and >= 0, top_p in
// [0, 1], top_k >= 0).
absl::Status CheckGenerateDirect(const std::vector<int64_t>& prompt, int max_tokens, const SamplingParams& base);
absl::StatusOr<std::vector<int64_t>> GenerateDirect(const LlamaWeights& weights, const std::vector<int64_t>& prompt,
                                                    int max_tokens, const SamplingParams& base,
                                                    const std::vector<int64_t>& stop_tokens = {});

class LlamaServingBackend {
 public:
  // `gmg` and `clock` must outlive the backend. Starts the device threads.
  static absl::StatusOr<std::unique_ptr<LlamaServingBackend>> Create(GlobalMappingGraph* gmg, const Clock* clock,
                                                                     ExecutorOptions options = {});
  ~LlamaServingBackend();
  LlamaServingBackend(const LlamaServingBackend&) = delete;
  LlamaServingBackend& operator=(const LlamaServingBackend&) = delete;

  // Loads (or replaces) the weights of deployment `dims.name` and routes its
  // templates to them. Fails with the loader's error (missing or mis-shaped
  // tensors, unreadable file) and leaves an existing deployment as it was.
  absl::Status AddModel(const LlamaDims& dims, const LlamaWeightsSource& source);
  bool HasModel(const std::string& deployment) const;

  // `tokens` is row-major int64 [batch, new_tokens].
  absl::Status SetRequest(const std::string& deployment, InstanceId instance, const std::vector<int64_t>& tokens,
                          int64_t batch, const SamplingParams& sampling);
  // The micro-batch of a "<deployment>/train" instance (llama_kernels.h):
  // set before its embedding can run, erased with EraseRequest.
  absl::Status SetTrainRequest(const std::string& deployment, InstanceId instance, LlamaTrainRequest request);
  // Serving and training requests alike.
  void EraseRequest(InstanceId instance);
  // The resident backbone of a deployment (shared, never copied): what its
  // operators read. Null when the deployment has no loaded weights.
  std::shared_ptr<const LlamaWeights> Weights(const std::string& deployment) const;
  // The token ids the instance's sample op produced (row-major [batch, 1]),
  // removed from the table; nullopt when it produced none (yet).
  std::optional<std::vector<int64_t>> TakeTokens(InstanceId instance);

  ExecutorSet& executors() { return *executors_; }

  // For each CUDA ordinal the devices use: the executors' accounting (the
  // pools of its devices and the weights copied there since the baseline)
  // against its caching allocator's growth since the baseline (device.h).
  // Call with no operator running (after Pause(), or idle). Empty without
  // CUDA devices.
  absl::StatusOr<std::map<int, MemoryReconciliation>> ReconcileMemory() const;
  // The allocator's state now becomes the baseline (at Create, before any
  // weights). Call it once every kind of operator has run, with no operator
  // running: cuBLAS keeps a workspace per stream from the caching allocator,
  // which no pool accounts for.
  absl::Status RebaselineMemory();

 private:
  class Router;
  LlamaServingBackend() = default;
  int64_t ResidentOn(int ordinal) const;  // the weights' copies on a GPU

  std::unique_ptr<Router> router_;
  std::vector<TensorDevice> placement_;          // by DeviceId, from the GMG's devices
  // By CUDA ordinal: the allocator's state and the weights' copies there at
  // the baseline (Create, or RebaselineMemory).
  std::map<int, CudaAllocatorStats> baseline_;
  std::map<int, int64_t> baseline_resident_;
  LlamaTransferBackend transfers_;
  std::unique_ptr<ExecutorSet> executors_;  // last: its threads stop first

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::vector<int64_t>> tokens_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::string> request_owner_ ABSL_GUARDED_BY(mu_);
};

}  // namespace slicesched::executor
