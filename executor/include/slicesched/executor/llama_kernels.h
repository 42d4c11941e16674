// Real execution of the Llama GMG operators (issue 5): a KernelRunner that
// runs the executor's LibTorch Llama operators (llama_ops.h) for the nodes of
// the "<name>/prefill" and "<name>/decode" templates (gmg/llama.h), and a
// TransferBackend that moves their payloads between (CPU) devices.
//
// Payloads (Buffer::kind / Buffer::payload):
//   kTensorPayload   std::shared_ptr<executor::Tensor>: hidden states, logits,
//                    sampled token ids
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
// Like every executor header this one is LibTorch-free; so is its .cc (it
// only uses the public operator API).
//
// Threading: Run() and the request table are thread-safe. The token sink is
// called from device threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "slicesched/common/ids.h"
#include "slicesched/executor/kernel.h"
#include "slicesched/executor/llama_ops.h"
#include "slicesched/executor/tensor.h"
#include "slicesched/gmg/llama.h"

namespace slicesched::executor {

enum : uint32_t {
  kTensorPayload = kFirstLibraryPayload,       // std::shared_ptr<Tensor>
  kKvCachePayload = kFirstLibraryPayload + 1,  // std::shared_ptr<KvCache>
};

// Payload accessors: null when the buffer holds another kind (or nothing).
const Tensor* TensorPayloadOf(const Buffer& b);
KvCache* KvCachePayloadOf(const Buffer& b);
void SetTensorPayload(Buffer& b, Tensor t);
void SetKvCachePayload(Buffer& b, std::shared_ptr<KvCache> cache);

// What the kernels need to know about one instance (one request step).
struct LlamaRequest {
  Tensor tokens;            // int64 [B, new_tokens]: the instance's $tokens
  SamplingParams sampling;  // for its sample op (vary the seed per step)
};

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
  void EraseRequest(InstanceId instance);
  size_t num_requests() const;
  // Optional; set before the runner is used.
  void SetTokenSink(LlamaTokenSink sink) { sink_ = std::move(sink); }

  absl::Status Run(const KernelCall& call) override;

  const LlamaWeights& weights() const { return *weights_; }
  int64_t calls() const;

 private:
  LlamaKernelRunner(std::shared_ptr<const LlamaWeights> weights, const LlamaDims& dims);
  absl::StatusOr<LlamaRequest> Lookup(InstanceId instance) const;
  absl::Status RunEmbedding(const KernelCall& call);
  absl::Status RunFusedLayers(const KernelCall& call);
  absl::Status RunLmHead(const KernelCall& call);
  absl::Status RunSample(const KernelCall& call);

  std::shared_ptr<const LlamaWeights> weights_;
  LlamaDims dims_;
  LlamaTokenSink sink_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, LlamaRequest> requests_ ABSL_GUARDED_BY(mu_);
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
};

// Moves Llama payloads between CPU devices: a kTensorPayload is shared (the
// operators never modify a tensor in place, so a shared CPU tensor behaves
// like a copy), a kKvCachePayload is copied into a new KvCache sharing the K
// and V tensors; every other kind goes to a HostTransferBackend.
class LlamaTransferBackend final : public TransferBackend {
 public:
  absl::Status Send(const TransferCall& call) override;

 private:
  HostTransferBackend host_;
};

}  // namespace slicesched::executor
