// The Llama KernelRunner and its TransferBackend. Torch-free TU: it uses only
// the public operator API (llama_ops.h, tensor.h).
#include "slicesched/executor/kernels/llama_kernels.h"

#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/torch/cpu_allocator.h"
#include "slicesched/executor/torch/aten_tensor.h"

namespace slicesched::executor {
namespace {

std::string Label(const KernelCall& call) {
  if (call.tpl == nullptr || call.op_index < 0) return call.node.ToString();
  return StrCat(call.tpl->name(), "/", call.op().name, " (node ", call.node, ")");
}

// The evaluated attribute `name` of the call's op, if the op declares it.
std::optional<int64_t> Attr(const KernelCall& call, std::string_view name) {
  const auto& attrs = call.op().attrs;
  for (size_t i = 0; i < attrs.size() && i < call.attrs.size(); ++i) {
    if (attrs[i].first == name) return call.attrs[i];
  }
  return std::nullopt;
}

std::string ShapeStr(std::span<const int64_t> s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

// The Tensor payload of op input `i` (an op output).
absl::StatusOr<Tensor> InputTensor(const KernelCall& call, size_t i) {
  if (i >= call.inputs.size()) {
    return absl::InvalidArgumentError(StrCat(Label(call), ": missing input ", i));
  }
  Tensor t = TensorPayloadOf(call.inputs[i]);
  if (!t.defined()) {
    return absl::FailedPreconditionError(
        StrCat(Label(call), ": input ", i, " ('", call.op().input_names[i],
               "') holds no tensor payload (payload kind ", call.inputs[i].kind, ")"));
  }
  return t;
}

// Columns [offset, offset + count) of a prompt's token ids [B, S].
absl::StatusOr<Tensor> PromptPiece(const KernelCall& call, const Tensor& tokens, int64_t offset, int64_t count) {
  const std::vector<int64_t> shape = tokens.shape();
  if (shape.size() != 2 || offset < 0 || count <= 0 || offset + count > shape[1]) {
    return absl::InvalidArgumentError(StrCat(Label(call), ": tokens ", offset, "..", offset + count,
                                             " of the prompt are outside $tokens ", ShapeStr(shape)));
  }
  const std::vector<int64_t> all = tokens.ToInt64();
  std::vector<int64_t> piece;
  piece.reserve(static_cast<size_t>(shape[0] * count));
  for (int64_t b = 0; b < shape[0]; ++b) {
    const auto row = all.begin() + b * shape[1] + offset;
    piece.insert(piece.end(), row, row + count);
  }
  return Tensor::FromInt64(piece, {shape[0], count});
}

absl::Status CheckOutputs(const KernelCall& call, size_t n) {
  if (call.outputs.size() != n) {
    return absl::InvalidArgumentError(
        StrCat(Label(call), ": expected ", n, " outputs, got ", call.outputs.size()));
  }
  return absl::OkStatus();
}

bool SameDims(const LlamaDims& a, const LlamaDims& b) {
  return a.layers == b.layers && a.hidden == b.hidden && a.heads == b.heads &&
         a.kv_heads == b.kv_heads && a.ffn == b.ffn && a.vocab == b.vocab && a.dtype == b.dtype &&
         a.fusion == b.fusion;
}

}  // namespace

// ---------------------------------------------------------------------------
// Payloads

Tensor TensorPayloadOf(const Buffer& b) {
  return b.kind == kTensorPayload ? TensorAccess::Shared(b.payload) : Tensor();
}

KvCache* KvCachePayloadOf(const Buffer& b) {
  return b.kind == kKvCachePayload ? static_cast<KvCache*>(b.payload.get()) : nullptr;
}

void SetTensorPayload(Buffer& b, Tensor t) {
  b.kind = kTensorPayload;
  b.payload = TensorAccess::Share(std::move(t));
}

void SetKvCachePayload(Buffer& b, std::shared_ptr<KvCache> cache) {
  b.kind = kKvCachePayload;
  b.payload = std::move(cache);
}

// ---------------------------------------------------------------------------
// LlamaKernelRunner

absl::StatusOr<std::unique_ptr<LlamaKernelRunner>> LlamaKernelRunner::Create(
    std::shared_ptr<const LlamaWeights> weights, const LlamaDims& dims) {
  if (weights == nullptr) return absl::InvalidArgumentError("LlamaKernelRunner: null weights");
  SLICESCHED_RETURN_IF_ERROR(dims.Validate());
  if (!SameDims(weights->dims(), dims)) {
    const LlamaDims& w = weights->dims();
    return absl::InvalidArgumentError(StrCat(
        "LlamaKernelRunner: the weights (model '", w.name, "': layers ", w.layers, ", hidden ",
        w.hidden, ", heads ", w.heads, "/", w.kv_heads, ", ffn ", w.ffn, ", vocab ", w.vocab,
        ", fusion ", w.fusion, ") do not match the dims of model '", dims.name, "' (layers ",
        dims.layers, ", hidden ", dims.hidden, ", heads ", dims.heads, "/", dims.kv_heads,
        ", ffn ", dims.ffn, ", vocab ", dims.vocab, ", fusion ", dims.fusion, ")"));
  }
  return std::unique_ptr<LlamaKernelRunner>(new LlamaKernelRunner(std::move(weights), dims));
}

LlamaKernelRunner::LlamaKernelRunner(std::shared_ptr<const LlamaWeights> weights,
                                     const LlamaDims& dims)
    : weights_(std::move(weights)), dims_(dims) {
  for (int64_t g = 0; g < dims_.num_groups(); ++g) group_keys_.push_back(LlamaGroupWeightKey(dims_, g));
}

absl::Status LlamaKernelRunner::Place(std::span<const TensorDevice> placement) {
  std::vector<const LlamaWeights*> on_device(placement.size(), nullptr);
  std::map<int, std::shared_ptr<const LlamaWeights>> replicas;
  for (size_t d = 0; d < placement.size(); ++d) {
    if (!placement[d].is_cuda()) continue;
    std::shared_ptr<const LlamaWeights>& copy = replicas[placement[d].index];
    if (copy == nullptr) {
      absl::StatusOr<std::shared_ptr<const LlamaWeights>> made = weights_->OnDevice(placement[d]);
      if (!made.ok()) return Annotate(made.status(), StrCat("placing the weights on ", placement[d].ToString()));
      copy = *std::move(made);
    }
    on_device[d] = copy.get();
  }
  on_device_ = std::move(on_device);
  replicas_ = std::move(replicas);
  placement_.assign(placement.begin(), placement.end());
  return absl::OkStatus();
}

const LlamaWeights& LlamaKernelRunner::WeightsOn(DeviceId device) const {
  const size_t d = device.value();
  return d < on_device_.size() && on_device_[d] != nullptr ? *on_device_[d] : *weights_;
}

Bytes LlamaKernelRunner::ResidentOn(int ordinal) const {
  const auto it = replicas_.find(ordinal);
  return it == replicas_.end() ? Bytes(0) : it->second->TotalBytes();
}

void LlamaKernelRunner::SetRequest(InstanceId instance, LlamaRequest request) {
  absl::MutexLock l(&mu_);
  requests_.insert_or_assign(instance.value(), std::move(request));
}

void LlamaKernelRunner::SetTrainRequest(InstanceId instance, LlamaTrainRequest request) {
  absl::MutexLock l(&mu_);
  train_requests_.insert_or_assign(instance.value(), std::move(request));
}

void LlamaKernelRunner::EraseRequest(InstanceId instance) {
  absl::MutexLock l(&mu_);
  requests_.erase(instance.value());
  train_requests_.erase(instance.value());
}

size_t LlamaKernelRunner::num_requests() const {
  absl::MutexLock l(&mu_);
  return requests_.size() + train_requests_.size();
}

absl::StatusOr<SamplingParams> LlamaKernelRunner::LookupSampling(InstanceId instance) const {
  absl::ReaderMutexLock l(&mu_);
  auto it = requests_.find(instance.value());
  if (it == requests_.end()) {
    return absl::FailedPreconditionError(
        StrCat("no Llama request registered for instance ", instance));
  }
  return it->second.sampling;
}

absl::StatusOr<Tensor> LlamaKernelRunner::LookupTokens(InstanceId instance) const {
  absl::ReaderMutexLock l(&mu_);
  if (auto t = train_requests_.find(instance.value()); t != train_requests_.end() && t->second.job != nullptr) {
    return t->second.batch.tokens;
  }
  if (auto r = requests_.find(instance.value()); r != requests_.end()) return r->second.tokens;
  return absl::FailedPreconditionError(
      StrCat("no Llama request registered for instance ", instance));
}

absl::StatusOr<LlamaTrainRequest> LlamaKernelRunner::LookupTrain(InstanceId instance) const {
  absl::ReaderMutexLock l(&mu_);
  auto it = train_requests_.find(instance.value());
  if (it == train_requests_.end() || it->second.job == nullptr) {
    return absl::FailedPreconditionError(
        StrCat("no Llama training request (with a job) registered for instance ", instance));
  }
  return it->second;
}

absl::Status LlamaKernelRunner::Run(const KernelCall& call) {
  if (call.tpl == nullptr || call.op_index < 0 || call.op_index >= call.tpl->num_ops()) {
    return absl::InvalidArgumentError(StrCat("kernel call for node ", call.node, " has no op"));
  }
  // One core per device thread (see SetIntraOpThreadsForThisThread), and
  // tensor memory from the thread's own cache (see cpu_allocator.h).
  thread_local bool threads_set = false;
  if (!threads_set) {
    SetIntraOpThreadsForThisThread(1);
    UseCachingCpuAllocatorOnThisThread();
    threads_set = true;
  }
  const size_t d = call.device.value();
  if (d >= placement_.size() || !placement_[d].is_cuda()) return RunOp(call);
  // A CUDA device's thread: bound to its GPU on its first operator; the
  // operator runs until the event behind its last kernel.
  thread_local int bound = -1;
  if (bound != placement_[d].index) {
    if (absl::Status s = BindThisThreadToCuda(placement_[d].index); !s.ok()) return Annotate(s, Label(call));
    bound = placement_[d].index;
  }
  // A failed operator may have queued kernels too: its buffers are freed
  // only once they have run.
  const absl::Status ran = RunOp(call);
  const absl::Status waited = WaitForThisThreadsWork();
  if (!ran.ok()) return ran;
  return waited.ok() ? waited : Annotate(waited, Label(call));
}

absl::Status LlamaKernelRunner::RunOp(const KernelCall& call) {
  switch (call.op().kind) {
    case OpKind::kEmbedding: return RunEmbedding(call);
    case OpKind::kFusedLayers: return RunFusedLayers(call);
    case OpKind::kLmHead: return RunLmHead(call);
    case OpKind::kSample: return RunSample(call);
    case OpKind::kTrainForward: return RunTrainForward(call);
    case OpKind::kTrainLoss: return RunTrainLoss(call);
    case OpKind::kTrainBackward: return RunTrainBackward(call);
    case OpKind::kOptimizerStep: return RunOptimizerStep(call);
    default:
      return absl::UnimplementedError(StrCat(Label(call), ": the Llama kernels do not implement op kind ",
                                             OpKindName(call.op().kind)));
  }
}

absl::Status LlamaKernelRunner::RunEmbedding(const KernelCall& call) {
  SLICESCHED_RETURN_IF_ERROR(CheckOutputs(call, 1));
  absl::StatusOr<Tensor> looked_up = LookupTokens(call.instance);
  if (!looked_up.ok()) return Annotate(looked_up.status(), Label(call));
  Tensor tokens = *std::move(looked_up);
  if (!tokens.defined()) {
    return absl::FailedPreconditionError(StrCat(Label(call), ": the request of instance ",
                                                call.instance, " has no $tokens"));
  }
  const std::optional<int64_t> batch = Attr(call, "batch");
  const std::optional<int64_t> news = Attr(call, "new_tokens");
  if (const std::optional<int64_t> offset = Attr(call, "token_offset"); offset.has_value()) {
    // A piece of a chunked prefill: its columns of the prompt.
    SLICESCHED_ASSIGN_OR_RETURN(tokens, PromptPiece(call, tokens, *offset, news.value_or(0)));
  }
  if (batch.has_value() && news.has_value()) {
    const int64_t want[] = {*batch, *news};
    if (!tokens.HasShape(want)) {
      return absl::InvalidArgumentError(StrCat(Label(call), ": $tokens has shape ",
                                               ShapeStr(tokens.shape()), ", the instance expects ",
                                               ShapeStr(want)));
    }
  }
  absl::StatusOr<Tensor> hidden = Embedding(WeightsOn(call.device), tokens);
  if (!hidden.ok()) return Annotate(hidden.status(), Label(call));
  SetTensorPayload(call.outputs[0], std::move(*hidden));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> LlamaKernelRunner::GroupOf(const KernelCall& call) const {
  // The group: the op whose weights are this group's layers.
  const OpSpec& op = call.op();
  for (size_t g = 0; g < group_keys_.size(); ++g) {
    if (op.weight_key == group_keys_[g]) return static_cast<int64_t>(g);
  }
  return absl::InvalidArgumentError(StrCat(Label(call), ": weight key '", op.weight_key,
                                           "' is not a layer group of model '", dims_.name, "'"));
}

absl::Status LlamaKernelRunner::RunFusedLayers(const KernelCall& call) {
  SLICESCHED_RETURN_IF_ERROR(CheckOutputs(call, 2));
  const OpSpec& op = call.op();
  SLICESCHED_ASSIGN_OR_RETURN(const int64_t group, GroupOf(call));
  // Inputs: the hidden state (the first op input) and, unless this is a
  // prefill's first piece, the cache to grow in place: an attached checkpoint
  // (decode) or the earlier pieces' cache, an op output with this op as its
  // only consumer (a later piece of a chunked prefill).
  std::optional<size_t> hidden_in, cache_in;
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    const bool from_op = op.inputs[i].kind == InputRef::Kind::kOp;
    if (from_op && !hidden_in.has_value()) {
      hidden_in = i;
    } else if ((from_op || op.inputs[i].kind == InputRef::Kind::kCheckpoint) && !cache_in.has_value()) {
      cache_in = i;
    }
  }
  if (!hidden_in.has_value()) {
    return absl::InvalidArgumentError(StrCat(Label(call), ": no hidden-state input"));
  }
  SLICESCHED_ASSIGN_OR_RETURN(const Tensor hidden, InputTensor(call, *hidden_in));

  if (!cache_in.has_value()) {
    // Prefill: a fresh cache, kept as the retained output's payload.
    auto cache = std::make_shared<KvCache>();
    absl::StatusOr<Tensor> out = FusedLayers(WeightsOn(call.device), group, hidden, cache.get(), 0);
    if (!out.ok()) return Annotate(out.status(), Label(call));
    SetTensorPayload(call.outputs[0], std::move(*out));
    SetKvCachePayload(call.outputs[1], std::move(cache));
    return absl::OkStatus();
  }
  if (*cache_in >= call.inputs.size()) {
    return absl::InvalidArgumentError(StrCat(Label(call), ": missing KV cache input"));
  }
  const Buffer& source = call.inputs[*cache_in];
  KvCache* cache = KvCachePayloadOf(source);
  if (cache == nullptr) {
    return absl::FailedPreconditionError(StrCat(Label(call), ": input '", op.input_names[*cache_in],
                                                "' holds no KV cache (payload kind ", source.kind, ")"));
  }
  const int64_t start = cache->tokens();
  if (const std::optional<int64_t> ctx = Attr(call, "context"); ctx.has_value() && *ctx != start) {
    return absl::FailedPreconditionError(StrCat(Label(call), ": the KV cache input holds ", start,
                                                " tokens, the instance expects context ", *ctx));
  }
  absl::StatusOr<Tensor> out = FusedLayers(WeightsOn(call.device), group, hidden, cache, start);
  if (!out.ok()) return Annotate(out.status(), Label(call));
  SetTensorPayload(call.outputs[0], std::move(*out));
  // The cache output is the grown input itself.
  call.outputs[1].kind = kKvCachePayload;
  call.outputs[1].payload = source.payload;
  return absl::OkStatus();
}

absl::Status LlamaKernelRunner::RunLmHead(const KernelCall& call) {
  SLICESCHED_RETURN_IF_ERROR(CheckOutputs(call, 1));
  SLICESCHED_ASSIGN_OR_RETURN(const Tensor hidden, InputTensor(call, 0));
  absl::StatusOr<Tensor> logits = LmHead(WeightsOn(call.device), hidden);
  if (!logits.ok()) return Annotate(logits.status(), Label(call));
  SetTensorPayload(call.outputs[0], std::move(*logits));
  return absl::OkStatus();
}

absl::Status LlamaKernelRunner::RunSample(const KernelCall& call) {
  SLICESCHED_RETURN_IF_ERROR(CheckOutputs(call, 1));
  SLICESCHED_ASSIGN_OR_RETURN(const Tensor logits, InputTensor(call, 0));
  absl::StatusOr<SamplingParams> sampling = LookupSampling(call.instance);
  if (!sampling.ok()) return Annotate(sampling.status(), Label(call));
  absl::StatusOr<Tensor> tokens = Sample(logits, *sampling);
  if (!tokens.ok()) return Annotate(tokens.status(), Label(call));
  if (sink_) sink_(call.instance, *tokens);
  SetTensorPayload(call.outputs[0], std::move(*tokens));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Training

namespace {

// The jobs of a request in slot order: {job, partners...}.
absl::StatusOr<std::vector<LlamaTrainJob*>> SlotJobs(const KernelCall& call, const LlamaTrainRequest& req) {
  std::vector<LlamaTrainJob*> jobs = {req.job.get()};
  for (size_t i = 0; i < req.partners.size(); ++i) {
    LlamaTrainJob* p = req.partners[i].get();
    if (p == nullptr || std::find(jobs.begin(), jobs.end(), p) != jobs.end()) {
      return absl::InvalidArgumentError(
          StrCat(Label(call), ": partner ", i, " of the training request is null or repeats a job"));
    }
    jobs.push_back(p);
  }
  return jobs;
}

// The jobs' current adapters (value copies: later steps do not change them).
std::vector<TaskAdapters> CurrentAdapters(const std::vector<LlamaTrainJob*>& jobs) {
  std::vector<TaskAdapters> out;
  for (LlamaTrainJob* job : jobs) {
    absl::MutexLock l(&job->mu);
    out.push_back(job->state.params);
  }
  return out;
}

std::vector<const TaskAdapters*> SlotPointers(const std::vector<TaskAdapters>& params) {
  std::vector<const TaskAdapters*> out;
  for (const TaskAdapters& p : params) out.push_back(&p);
  return out;
}

// Checks the instance's R / NC / T bindings against the slots' adapters (NC
// is the sum of their head outputs).
absl::Status CheckJobAttrs(const KernelCall& call, std::span<const TaskAdapters* const> params) {
  int64_t outputs = 0;
  for (const TaskAdapters* p : params) {
    outputs += p->head_outputs();
    if (const std::optional<int64_t> r = Attr(call, "rank"); r.has_value() && *r != p->lora.rank) {
      return absl::FailedPreconditionError(StrCat(Label(call), ": the instance binds LoRA rank R = ", *r,
                                                  ", the job's adapters have rank ", p->lora.rank));
    }
  }
  if (const std::optional<int64_t> nc = Attr(call, "outputs"); nc.has_value() && *nc != outputs) {
    return absl::FailedPreconditionError(StrCat(Label(call), ": the instance binds NC = ", *nc,
                                                params.size() > 1 ? ", the jobs' heads have " : ", the job's head has ",
                                                outputs, " outputs"));
  }
  if (const std::optional<int64_t> t = Attr(call, "tasks");
      t.has_value() && *t != static_cast<int64_t>(params.size())) {
    return absl::FailedPreconditionError(StrCat(Label(call), ": the instance binds T = ", *t,
                                                " task slots, the training request has ", params.size(), " jobs"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LlamaKernelRunner::RunTrainForward(const KernelCall& call) {
  SLICESCHED_RETURN_IF_ERROR(CheckOutputs(call, 2));
  SLICESCHED_ASSIGN_OR_RETURN(const int64_t group, GroupOf(call));
  absl::StatusOr<LlamaTrainRequest> req = LookupTrain(call.instance);
  if (!req.ok()) return Annotate(req.status(), Label(call));
  SLICESCHED_ASSIGN_OR_RETURN(const Tensor hidden, InputTensor(call, 0));
  SLICESCHED_ASSIGN_OR_RETURN(const std::vector<LlamaTrainJob*> jobs, SlotJobs(call, *req));
  const std::vector<TaskAdapters> params = CurrentAdapters(jobs);
  const std::vector<const TaskAdapters*> slots = SlotPointers(params);
  SLICESCHED_RETURN_IF_ERROR(CheckJobAttrs(call, slots));
  absl::StatusOr<GroupForwardResult> f =
      TrainGroupForward(WeightsOn(call.device), group, slots, req->batch.row_task, hidden, req->batch.row_pad);
  if (!f.ok()) return Annotate(f.status(), Label(call));
  SetTensorPayload(call.outputs[0], std::move(f->hidden_out));
  call.outputs[1].kind = kGroupTapePayload;
  call.outputs[1].payload = std::move(f->tape);
  return absl::OkStatus();
}

absl::Status LlamaKernelRunner::RunTrainLoss(const KernelCall& call) {
  SLICESCHED_RETURN_IF_ERROR(CheckOutputs(call, 3));
  absl::StatusOr<LlamaTrainRequest> req = LookupTrain(call.instance);
  if (!req.ok()) return Annotate(req.status(), Label(call));
  SLICESCHED_ASSIGN_OR_RETURN(const Tensor hidden, InputTensor(call, 0));
  SLICESCHED_ASSIGN_OR_RETURN(const std::vector<LlamaTrainJob*> jobs, SlotJobs(call, *req));
  const std::vector<TaskAdapters> params = CurrentAdapters(jobs);
  const std::vector<const TaskAdapters*> slots = SlotPointers(params);
  SLICESCHED_RETURN_IF_ERROR(CheckJobAttrs(call, slots));
  absl::StatusOr<HeadLossResult> r =
      TrainHeadLoss(WeightsOn(call.device), slots, req->batch.row_task, hidden, req->batch.labels,
                    req->batch.row_pad);
  if (!r.ok()) return Annotate(r.status(), Label(call));
  std::vector<float> loss;
  for (double l : r->loss) loss.push_back(static_cast<float>(l));
  const auto n = static_cast<int64_t>(loss.size());
  SetTensorPayload(call.outputs[0], std::move(r->d_hidden));
  if (slots.size() == 1) {
    SetTensorPayload(call.outputs[1], std::move(r->d_head[0]));
  } else {
    auto heads = std::make_shared<HeadGrads>();
    heads->slots = std::move(r->d_head);
    call.outputs[1].kind = kHeadGradsPayload;
    call.outputs[1].payload = std::move(heads);  // never modified once made
  }
  SetTensorPayload(call.outputs[2], Tensor::FromFloat(loss, {n}));
  return absl::OkStatus();
}

absl::Status LlamaKernelRunner::RunTrainBackward(const KernelCall& call) {
  SLICESCHED_RETURN_IF_ERROR(CheckOutputs(call, 2));
  SLICESCHED_ASSIGN_OR_RETURN(const int64_t group, GroupOf(call));
  SLICESCHED_ASSIGN_OR_RETURN(const Tensor d_out, InputTensor(call, 0));
  if (call.inputs.size() < 2 || call.inputs[1].kind != kGroupTapePayload ||
      call.inputs[1].payload == nullptr) {
    return absl::FailedPreconditionError(
        StrCat(Label(call), ": input 1 holds no training tape (the forward's 'tape' output)"));
  }
  auto* tape = static_cast<GroupTape*>(call.inputs[1].payload.get());
  absl::StatusOr<GroupBackwardResult> r = TrainGroupBackward(*tape, d_out);
  if (!r.ok()) return Annotate(r.status(), Label(call));
  const int64_t tasks = Attr(call, "tasks").value_or(1);
  if (static_cast<int64_t>(r->grads.size()) != tasks || r->grads.empty()) {
    return absl::FailedPreconditionError(
        StrCat(Label(call), ": the tape holds ", r->grads.size(), " tasks, expected ", tasks));
  }
  auto grads = std::make_shared<LoraGroupGrads>();
  grads->first_layer = group * dims_.fusion;
  grads->layers = std::move(r->grads[0]);
  for (size_t t = 1; t < r->grads.size(); ++t) grads->partners.push_back(std::move(r->grads[t]));
  SetTensorPayload(call.outputs[0], std::move(r->d_hidden_in));
  call.outputs[1].kind = kLoraGradsPayload;
  call.outputs[1].payload = std::move(grads);  // never modified once made
  return absl::OkStatus();
}

absl::Status LlamaKernelRunner::RunOptimizerStep(const KernelCall& call) {
  SLICESCHED_RETURN_IF_ERROR(CheckOutputs(call, 1));
  absl::StatusOr<LlamaTrainRequest> req = LookupTrain(call.instance);
  if (!req.ok()) return Annotate(req.status(), Label(call));
  SLICESCHED_ASSIGN_OR_RETURN(const std::vector<LlamaTrainJob*> jobs, SlotJobs(call, *req));
  const size_t T = jobs.size();
  if (req->micro_index >= 0 && T != 1) {
    return absl::InvalidArgumentError(StrCat(Label(call), ": micro_index ", req->micro_index,
                                             " on a joint request of ", T,
                                             " jobs: ordered accumulation of concurrent micro-batches "
                                             "is for single-job requests only"));
  }
  const OpSpec& op = call.op();
  // Gather the gradients: every layer of every slot exactly once from the
  // groups' payloads, the heads' from "...:head_grad", the losses from
  // "...:loss".
  std::vector<std::vector<LoraLayer>> layers(T, std::vector<LoraLayer>(static_cast<size_t>(dims_.layers)));
  std::vector<bool> seen(static_cast<size_t>(dims_.layers), false);
  std::vector<Tensor> heads;
  std::vector<float> losses;
  for (size_t i = 0; i < call.inputs.size() && i < op.input_names.size(); ++i) {
    const Buffer& in = call.inputs[i];
    const std::string& name = op.input_names[i];
    if (in.kind == kLoraGradsPayload && in.payload != nullptr) {
      const auto* g = static_cast<const LoraGroupGrads*>(in.payload.get());
      if (g->partners.size() + 1 != T) {
        return absl::InvalidArgumentError(StrCat(Label(call), ": input '", name, "' holds gradients of ",
                                                 g->partners.size() + 1, " task slots, the request has ", T));
      }
      for (size_t l = 0; l < g->layers.size(); ++l) {
        const int64_t layer = g->first_layer + static_cast<int64_t>(l);
        if (layer < 0 || layer >= dims_.layers || seen[static_cast<size_t>(layer)]) {
          return absl::InvalidArgumentError(StrCat(Label(call), ": input '", name,
                                                   "' holds gradients of layer ", layer,
                                                   " twice or out of range"));
        }
        seen[static_cast<size_t>(layer)] = true;
        layers[0][static_cast<size_t>(layer)] = g->layers[l];
        for (size_t t = 1; t < T; ++t) {
          if (g->partners[t - 1].size() != g->layers.size()) {
            return absl::InvalidArgumentError(
                StrCat(Label(call), ": input '", name, "' holds ", g->partners[t - 1].size(),
                       " layers for slot ", t, ", ", g->layers.size(), " for slot 0"));
          }
          layers[t][static_cast<size_t>(layer)] = g->partners[t - 1][l];
        }
      }
    } else if (name.ends_with(":head_grad")) {
      if (in.kind == kHeadGradsPayload && in.payload != nullptr) {
        heads = static_cast<const HeadGrads*>(in.payload.get())->slots;
      } else {
        SLICESCHED_ASSIGN_OR_RETURN(const Tensor t, InputTensor(call, i));
        heads = {t};
      }
    } else if (name.ends_with(":loss")) {
      SLICESCHED_ASSIGN_OR_RETURN(const Tensor t, InputTensor(call, i));
      losses = t.ToFloat();
      if (losses.size() != T) {
        return absl::InvalidArgumentError(
            StrCat(Label(call), ": loss input is ", t.DebugString(), ", expected ", T, " values"));
      }
    } else {
      return absl::InvalidArgumentError(
          StrCat(Label(call), ": unexpected input '", name, "' (payload kind ", in.kind, ")"));
    }
  }
  for (size_t l = 0; l < seen.size(); ++l) {
    if (!seen[l]) {
      return absl::FailedPreconditionError(
          StrCat(Label(call), ": no gradients for layer ", l, " among the inputs"));
    }
  }
  if (heads.size() != T) {
    return absl::FailedPreconditionError(StrCat(Label(call), ": no ':head_grad' input for each of the ", T,
                                                " task slots (got ", heads.size(), ")"));
  }
  if (req->micro_index >= 0) {
    // Data parallelism: park the gradient and fold in micro_index order.
    LlamaTrainJob& job = *jobs[0];
    absl::MutexLock l(&job.mu);
    const TaskAdapters* current[] = {&job.state.params};
    SLICESCHED_RETURN_IF_ERROR(CheckJobAttrs(call, current));
    TaskAdapters grads;
    grads.lora = job.state.params.lora;
    grads.layers = std::move(layers[0]);
    grads.head = std::move(heads[0]);
    std::optional<double> loss;
    if (!losses.empty()) loss = losses[0];
    if (absl::Status s = AccumulateInOrder(job, req->micro_index, std::move(grads), loss); !s.ok()) {
      return Annotate(s, Label(call));
    }
    const std::vector<int64_t> step = {job.state.step};
    SetTensorPayload(call.outputs[0], Tensor::FromInt64(step, {1}));
    return absl::OkStatus();
  }
  // Which slots have rows in this micro-batch (all of them for one task).
  std::vector<bool> present(T, T == 1);
  for (int64_t t : req->batch.row_task) {
    if (t >= 0 && static_cast<size_t>(t) < T) present[static_cast<size_t>(t)] = true;
  }
  if (req->batch.row_task.empty()) present[0] = true;
  // Every job's mutex, in address order (the same jobs may meet in other
  // requests in another slot order).
  std::vector<LlamaTrainJob*> lock_order = jobs;
  std::sort(lock_order.begin(), lock_order.end());
  for (LlamaTrainJob* j : lock_order) j->mu.Lock();
  absl::Status status = [&]() -> absl::Status {
    std::vector<const TaskAdapters*> current;
    for (LlamaTrainJob* j : jobs) current.push_back(&j->state.params);
    SLICESCHED_RETURN_IF_ERROR(CheckJobAttrs(call, current));
    // Accumulate into copies first: a failure leaves every job unchanged.
    std::vector<TaskState> next;
    for (size_t t = 0; t < T; ++t) {
      next.push_back(jobs[t]->state);
      if (!present[t]) continue;
      TaskAdapters grads;
      grads.lora = jobs[t]->state.params.lora;
      grads.layers = std::move(layers[t]);
      grads.head = std::move(heads[t]);
      if (absl::Status s = AccumulateGradients(next.back(), grads); !s.ok()) return Annotate(s, Label(call));
    }
    bool full = true;
    for (size_t t = 0; t < T; ++t) full &= next[t].accumulated >= std::max<int64_t>(1, jobs[t]->accumulation);
    if (full) {
      if (T == 1) {
        if (absl::Status s = OptimizerStep(next[0]); !s.ok()) return Annotate(s, Label(call));
      } else {
        std::vector<TaskState*> ptrs;
        for (TaskState& s : next) ptrs.push_back(&s);
        if (absl::Status s = JointOptimizerStep(ptrs, jobs[0]->joint_rule); !s.ok()) return Annotate(s, Label(call));
      }
    }
    for (size_t t = 0; t < T; ++t) {
      jobs[t]->state = std::move(next[t]);
      if (present[t] && !losses.empty()) jobs[t]->losses.push_back(losses[t]);
    }
    return absl::OkStatus();
  }();
  const int64_t step0 = jobs[0]->state.step;
  for (LlamaTrainJob* j : lock_order) j->mu.Unlock();
  SLICESCHED_RETURN_IF_ERROR(status);
  const std::vector<int64_t> step = {step0};
  SetTensorPayload(call.outputs[0], Tensor::FromInt64(step, {1}));
  return absl::OkStatus();
}

absl::Status AccumulateInOrder(LlamaTrainJob& job, int64_t micro_index, TaskAdapters grads,
                               std::optional<double> loss) {
  const int64_t per_step = std::max<int64_t>(1, job.accumulation);
  int64_t next = job.state.step * per_step + job.state.accumulated;
  if (micro_index < next) {
    return absl::FailedPreconditionError(StrCat("micro-batch ", micro_index,
                                                " was already accumulated (the job expects micro-batch ", next,
                                                " next)"));
  }
  if (job.pending.contains(micro_index)) {
    return absl::FailedPreconditionError(StrCat("micro-batch ", micro_index, " is already waiting to be accumulated"));
  }
  job.pending.emplace(micro_index, LlamaTrainJob::Parked{std::move(grads), loss});
  // Fold in index order: exactly the calls a sequential stream makes.
  for (auto it = job.pending.begin(); it != job.pending.end() && it->first == next; it = job.pending.begin()) {
    SLICESCHED_RETURN_IF_ERROR(AccumulateGradients(job.state, it->second.grads));
    if (it->second.loss.has_value()) job.losses.push_back(*it->second.loss);
    job.pending.erase(it);
    if (job.state.accumulated >= per_step) SLICESCHED_RETURN_IF_ERROR(OptimizerStep(job.state));
    next = job.state.step * per_step + job.state.accumulated;
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// LlamaTransferBackend

absl::Status LlamaTransferBackend::Send(const TransferCall& call) {
  const Buffer& from = *call.from;
  Buffer& to = *call.to;
  switch (from.kind) {
    case kTensorPayload: {
      if (from.payload == nullptr) {
        return absl::FailedPreconditionError(
            StrCat("transfer ", call.node, ": the source tensor has no payload"));
      }
      if (DeviceAt(call.dst) == DeviceAt(call.src)) {
        to.kind = kTensorPayload;
        to.payload = from.payload;  // immutable tensor on the same device: sharing is a copy
        return absl::OkStatus();
      }
      absl::StatusOr<Tensor> copy = ToDevice(TensorAccess::Shared(from.payload), DeviceAt(call.dst));
      if (!copy.ok()) return Annotate(copy.status(), StrCat("transfer ", call.node));
      SetTensorPayload(to, *std::move(copy));
      return absl::OkStatus();
    }
    case kKvCachePayload: {
      const KvCache* src = KvCachePayloadOf(from);
      if (src == nullptr) {
        return absl::FailedPreconditionError(
            StrCat("transfer ", call.node, ": the source KV cache has no payload"));
      }
      auto copy = std::make_shared<KvCache>(*src);
      SLICESCHED_RETURN_IF_ERROR(copy->MoveTo(DeviceAt(call.dst)));  // shares K and V on the same device
      SetKvCachePayload(to, std::move(copy));
      return absl::OkStatus();
    }
    case kGroupTapePayload:
    case kLoraGradsPayload:
    case kHeadGradsPayload:
      if (from.payload == nullptr) {
        return absl::FailedPreconditionError(
            StrCat("transfer ", call.node, ": the source has no payload (kind ", from.kind, ")"));
      }
      to.kind = from.kind;
      to.payload = from.payload;  // host memory: sharing is the copy
      return absl::OkStatus();
    default:
      return host_.Send(call);
  }
}

}  // namespace slicesched::executor
