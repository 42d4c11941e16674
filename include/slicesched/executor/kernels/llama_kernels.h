// Real execution of the Llama GMG operators: a KernelRunner that
// runs the executor's LibTorch Llama operators (llama_ops.h) for the nodes of
// the "<name>/prefill" and "<name>/decode" templates (gmg/llama.h), and a
// TransferBackend that moves their payloads between (CPU) devices.
//
// Payloads (Buffer::kind / Buffer::payload):
//   kTensorPayload   an executor::Tensor's own shared state (no wrapper of its
//                    own: SetTensorPayload / TensorPayloadOf): hidden states,
//                    logits, sampled token ids
//   kKvCachePayload  std::shared_ptr<executor::KvCache>: a fused group's KV
//                    cache (the retained "kv" output of a prefill group; the
//                    same object is grown in place by every decode step that
//                    attaches it as a checkpoint)
//
// Dispatch on the op kind of the KernelCall:
//   embedding     reads the instance's $tokens (the registered LlamaRequest)
//   fused_layers  prefill (no checkpoint input): start position 0 and a fresh
//                 KvCache stored in the retained output's payload;
//                 decode (checkpoint input @kv{g}): the KvCache of the
//                 checkpoint input buffer is appended to in place, and the
//                 update output's payload aliases that same KvCache
//   lm_head       last position -> f32 logits
//   sample        token ids int64 [B, 1], also reported to the token sink
//
// Training ("<name>/train", one micro-batch of a fine-tuning job; see
// BuildLlamaTrainTemplate and train_ops.h). The instance's LlamaTrainRequest
// names the job (its shared TaskState) and the micro-batch:
//   embedding       reads the micro-batch's tokens
//   train_forward   TrainGroupForward with the job's current adapters;
//                   outputs hidden and a kGroupTapePayload
//   train_loss      TrainHeadLoss against the micro-batch's labels; outputs
//                   d_hidden, head_grad and the loss (f32 [1])
//   train_backward  TrainGroupBackward(tape, d_hidden); outputs d_hidden of
//                   the group's input and a kLoraGradsPayload
//   optimizer_step  AccumulateGradients of all groups' and the head's
//                   gradients into the job, and OptimizerStep (AdamW or SGD) once the job has
//                   accumulated `accumulation` micro-batches; outputs the
//                   job's step count (int64 [1])
// The iterations of one job must run one after another (each forward reads
// the adapters as the previous optimizer left them).
//
// Data parallelism: the micro-batches of ONE iteration may run concurrently
// (on different devices) when each request names its micro_index, the job's
// global micro-batch number (step * accumulation + accumulated at the time
// it was submitted). Their optimizer_step ops then park each gradient (and
// loss) in LlamaTrainJob::pending and fold the parked ones into the state in
// micro_index order, starting at the next index the state expects, each
// AccumulateGradients and OptimizerStep exactly as one sequential micro-batch
// stream would do them: the result is bit-identical to sequential
// accumulation whatever order the micro-batches finish in. An index the
// state already accumulated, or one already parked, fails the op. The caller
// must submit the next iteration's micro-batches only after the previous
// iteration's optimizer step (they read the stepped adapters). A joint
// request (below) cannot carry a micro_index: its optimizer_step fails.
//
// Spatial joint training (train_ops.h, "Spatial joint training"): a request
// with `partners` trains T = 1 + partners.size() jobs in one instance on a
// mixed batch (batch.row_task indexes the slots {job, partners...}); the
// instance binds T and NC = the sum of the slots' head outputs. Then
//   train_forward   runs every row through its slot's adapters
//   train_loss      outputs per-slot head gradients (kHeadGradsPayload) and
//                   per-slot losses (f32 [T])
//   train_backward  per-slot LoRA gradients (LoraGroupGrads::partners)
//   optimizer_step  accumulates each slot's gradients into its own job
//                   (a slot without rows in the batch accumulates nothing),
//                   and once every job has accumulated its own
//                   `accumulation` micro-batches takes one JointOptimizerStep
//                   over all of them (the jobs must share one LoRA adapter:
//                   ShareLora); outputs slot 0's step count.
// Each job keeps its own TaskState throughout, so a job trained jointly is
// at every instant an independent task (decoupling loses nothing).
//
// Like every executor header this one is LibTorch-free; so is its .cc (it
// only uses the public operator API).
//
// Threading: Run() and the request table are thread-safe. The token sink is
// called from device threads.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "slicesched/common/ids.h"
#include "slicesched/executor/runtime/kernel.h"
#include "slicesched/executor/llama/llama_ops.h"
#include "slicesched/executor/torch/device.h"
#include "slicesched/executor/torch/tensor.h"
#include "slicesched/executor/train/train_ops.h"
#include "slicesched/gmg/llama.h"

namespace slicesched::executor {

enum : uint32_t {
  kTensorPayload = kFirstLibraryPayload,         // a Tensor's shared state (SetTensorPayload)
  kKvCachePayload = kFirstLibraryPayload + 1,    // std::shared_ptr<KvCache>
  kGroupTapePayload = kFirstLibraryPayload + 2,  // std::shared_ptr<GroupTape>
  kLoraGradsPayload = kFirstLibraryPayload + 3,  // std::shared_ptr<LoraGroupGrads> (immutable)
  kHeadGradsPayload = kFirstLibraryPayload + 4,  // std::shared_ptr<HeadGrads> (immutable)
};

// The LoRA gradients of one fused group (layers first_layer ..).
struct LoraGroupGrads {
  int64_t first_layer = 0;
  std::vector<LoraLayer> layers;  // slot 0
  // A joint step's other slots: partners[t-1][l] for slot t.
  std::vector<std::vector<LoraLayer>> partners;
};

// A joint step's head gradients, one [outputs_t, hidden] per slot.
struct HeadGrads {
  std::vector<Tensor> slots;
};

// Payload accessors. TensorPayloadOf: a handle sharing the payload's tensor,
// undefined when the buffer holds another kind (or nothing); the payload is
// the tensor's own shared state, so it lives while the buffer or any handle
// does. KvCachePayloadOf: null when the buffer holds another kind.
Tensor TensorPayloadOf(const Buffer& b);
KvCache* KvCachePayloadOf(const Buffer& b);
void SetTensorPayload(Buffer& b, Tensor t);
void SetKvCachePayload(Buffer& b, std::shared_ptr<KvCache> cache);

// What the kernels need to know about one instance (one request step).
struct LlamaRequest {
  Tensor tokens;            // int64 [B, new_tokens]: the instance's $tokens
  SamplingParams sampling;  // for its sample op (vary the seed per step)
};

// One fine-tuning job (task) trained through "<name>/train" instances.
struct LlamaTrainJob {
  absl::Mutex mu;
  TaskState state ABSL_GUARDED_BY(mu);
  int64_t accumulation = 1;                        // micro-batches per optimizer step
  // A spatial pair's shared-adapter step (train_ops.h): the rule of the
  // request's first job applies. Set before the job is first scheduled.
  JointStepRule joint_rule = JointStepRule::kMean;
  std::vector<double> losses ABSL_GUARDED_BY(mu);  // per micro-batch, in order
  // Data parallelism (see the header comment): gradients of micro-batches
  // that finished before an earlier-numbered one, by micro_index.
  struct Parked {
    TaskAdapters grads;
    std::optional<double> loss;
  };
  std::map<int64_t, Parked> pending ABSL_GUARDED_BY(mu);
};

// What the kernels need to know about one training instance.
struct LlamaTrainRequest {
  std::shared_ptr<LlamaTrainJob> job;
  TrainBatch batch;  // one task: row_task empty; joint: row_task over {job, partners...}
  // -1: accumulate on arrival (one micro-batch stream per job). >= 0: the
  // job's global micro-batch number, accumulated in this order (see above);
  // single-job requests only (must be -1 when `partners` is non-empty).
  int64_t micro_index = -1;
  // Spatial joint training: the other jobs (slots 1..), distinct from `job`
  // and from each other. Empty: a plain single-job step.
  std::vector<std::shared_ptr<LlamaTrainJob>> partners;
};

// The optimizer_step's accumulation for a request with micro_index >= 0:
// parks `grads` / `loss` under `micro_index` and folds every parked entry
// that is next in order into job.state (OptimizerStep after each
// job.accumulation-th), appending their losses. FailedPrecondition naming
// the indices when micro_index was already accumulated or is already parked.
// Exposed for tests; requires job.mu.
absl::Status AccumulateInOrder(LlamaTrainJob& job, int64_t micro_index, TaskAdapters grads,
                               std::optional<double> loss) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);

// Called by the sample op with the token ids it produced ([B, 1] int64).
using LlamaTokenSink = std::function<void(InstanceId instance, const Tensor& tokens)>;

class LlamaKernelRunner final : public KernelRunner {
 public:
  // Fails when `dims` do not describe `weights` (every dimension, the dtype
  // and the fusion factor must match: the templates must come from the same
  // dims).
  static absl::StatusOr<std::unique_ptr<LlamaKernelRunner>> Create(
      std::shared_ptr<const LlamaWeights> weights, const LlamaDims& dims);

  // The request of an instance: set it before the instance's embedding op can
  // run (typically right after Instantiate), erase it once retired.
  void SetRequest(InstanceId instance, LlamaRequest request);
  // The same for a training instance.
  void SetTrainRequest(InstanceId instance, LlamaTrainRequest request);
  // Erases the instance's request (serving or training).
  void EraseRequest(InstanceId instance);
  size_t num_requests() const;
  // Optional; set before the runner is used.
  void SetTokenSink(LlamaTokenSink sink) { sink_ = std::move(sink); }

  // Where each device of the cluster runs its operators, by DeviceId (a
  // device beyond the list runs on the CPU). Copies the weights once to each
  // CUDA ordinal named; fails with the copy's error (no such device, out of
  // memory) and leaves the placement as it was. Call before the runner runs.
  // A CUDA device's thread is bound to its GPU and a stream of its own on its
  // first operator, and each operator runs from its launch to the completion
  // event recorded behind its last kernel (device.h).
  absl::Status Place(std::span<const TensorDevice> placement);

  absl::Status Run(const KernelCall& call) override;

  // The weights as loaded (host memory); WeightsOn: those a device's
  // operators read.
  const LlamaWeights& weights() const { return *weights_; }
  const LlamaWeights& WeightsOn(DeviceId device) const;
  // The bytes of the weights' copy on CUDA device `ordinal` (0 without one).
  Bytes ResidentOn(int ordinal) const;
  const std::shared_ptr<const LlamaWeights>& shared_weights() const { return weights_; }

 private:
  LlamaKernelRunner(std::shared_ptr<const LlamaWeights> weights, const LlamaDims& dims);
  // The sampling parameters of the instance's serving request.
  absl::StatusOr<SamplingParams> LookupSampling(InstanceId instance) const;
  absl::Status RunEmbedding(const KernelCall& call);
  absl::Status RunFusedLayers(const KernelCall& call);
  absl::Status RunLmHead(const KernelCall& call);
  absl::Status RunSample(const KernelCall& call);
  absl::StatusOr<LlamaTrainRequest> LookupTrain(InstanceId instance) const;
  // The tokens of the instance's training batch, else of its serving
  // request (one lookup: no error built on the serving path).
  absl::StatusOr<Tensor> LookupTokens(InstanceId instance) const;
  absl::StatusOr<int64_t> GroupOf(const KernelCall& call) const;
  absl::Status RunOp(const KernelCall& call);
  absl::Status RunTrainForward(const KernelCall& call);
  absl::Status RunTrainLoss(const KernelCall& call);
  absl::Status RunTrainBackward(const KernelCall& call);
  absl::Status RunOptimizerStep(const KernelCall& call);

  std::shared_ptr<const LlamaWeights> weights_;
  // By DeviceId: the weights its operators read (null: weights_), and the
  // copies on each CUDA ordinal they point into.
  std::vector<const LlamaWeights*> on_device_;
  std::vector<TensorDevice> placement_;
  std::map<int, std::shared_ptr<const LlamaWeights>> replicas_;  // by CUDA ordinal
  LlamaDims dims_;
  std::vector<std::string> group_keys_;  // LlamaGroupWeightKey of each group
  LlamaTokenSink sink_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, LlamaRequest> requests_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, LlamaTrainRequest> train_requests_ ABSL_GUARDED_BY(mu_);
};

// Moves Llama payloads between CPU devices: a kTensorPayload is shared (the
// operators never modify a tensor in place, so a shared CPU tensor behaves
// like a copy), a kKvCachePayload is copied into a new KvCache sharing the K
// and V tensors, kLoraGradsPayload and kHeadGradsPayload (immutable) and
// kGroupTapePayload (host memory, used by one backward) are shared; every
// other kind goes to a HostTransferBackend.
class LlamaTransferBackend final : public TransferBackend {
 public:
  // Where each device keeps its tensors (LlamaKernelRunner::Place): a tensor
  // or KV cache crossing to a device elsewhere is copied there (host to
  // device through pinned memory, device to device on the copy engine); one
  // staying on the same device, or between CPU devices, is shared.
  void Place(std::vector<TensorDevice> placement) { placement_ = std::move(placement); }
  absl::Status Send(const TransferCall& call) override;

 private:
  TensorDevice DeviceAt(DeviceId d) const {
    return d.value() < placement_.size() ? placement_[d.value()] : TensorDevice::Cpu();
  }
  std::vector<TensorDevice> placement_;  // constant once the executors run
  HostTransferBackend host_;
};

}  // namespace slicesched::executor
