// Training operators for parameter-efficient fine-tuning on a frozen, shared
// Llama backbone (the base of the daemon's fine-tuning
// runtime): LoRA adapters, a per-task head, the training forward/backward of
// fused layer groups with autograd, a cross-entropy loss, gradient
// accumulation, AdamW with optimizer state per task, spatial joint training
// of two tasks on a shared adapter, temporal transfer (copying adapters) and
// checkpoints of the whole trainable state.
//
// Model. The backbone (LlamaWeights, the same object serving uses) is never
// written and never gets a gradient. Each decoder layer i gets LoRA factors on
// its attention q and v projections (the choice of the LoRA paper, Hu et al.
// 2021, §7.1: adapting W_q and W_v gives the best quality per parameter):
//
//   q = h W_q^T + s * (h A_q^T) B_q^T,   v = h W_v^T + s * (h A_v^T) B_v^T,
//   s = alpha / rank,  A_* [rank, hidden] ~ N(0, 1/hidden),  B_* = 0,
//
// so an initialised adapter leaves the backbone's function unchanged. The
// LoRA branch is computed in f32 and cast to the model dtype before it is
// added. A task head is a linear map [outputs, hidden] (f32, no bias) over
// the final hidden state after the backbone's (frozen) final RMSNorm, applied
// at EVERY position; its init is N(0, 1/hidden) from the task seed.
//
// Objective. Token-level cross-entropy against `labels` int64 [B, S], with
// label -1 meaning "no loss here". The loss of a task is the mean over its
// labelled positions. This one objective covers both fine-tuning task kinds:
//   next-token LM:           head outputs = vocab, labels = NextTokenLabels()
//   sequence classification: head outputs = classes, labels = the class at
//                            the last position only (LastPositionLabels())
//
// Batches may mix tasks: TrainBatch::row_task names, per row, which of the
// call's task adapters (its "slot") that row runs through. Each slot's
// adapters are separate autograd leaves, so one forward and one backward give
// every task its own gradient, even when two slots hold the same (shared)
// adapter values: this is what keeps spatial joint training decomposable.
//
// Padding. Rows of different lengths share a batch left-padded to the
// longest one; TrainBatch::row_pad says how many leading positions of each
// row are padding (0 <= pad < S). A padded row computes what it would
// unpadded: its real tokens never attend to its pad positions (a key-padding
// mask on top of the causal one), they take RoPE positions 0, 1, .. from
// their first real token, and the loss ignores the pad positions (their
// labels count as -1 whatever they hold). Pad positions themselves attend
// only to pad positions; nothing depends on their outputs, so they give no
// gradient. A batch whose row_pad is empty or all zero runs exactly the
// unmasked computation (bit-identical to no row_pad). This makes a spatial
// pair's mixed micro-batch (rows of two jobs of different lengths) give each
// job the loss and gradients of its own rows alone, up to float rounding of
// the differently shaped matmuls.
//
// Pipeline split. TrainGroupForward(g) takes hidden states in and returns
// hidden states out plus a GroupTape that keeps what the backward needs;
// TrainHeadLoss runs the head, the loss and the head's backward and returns
// d(hidden); TrainGroupBackward(tape, d(out)) returns d(in) and the group's
// LoRA gradients. Only Tensors pass between groups, so groups may live on
// different devices (pp2). ComputeGradients composes these (kPipelined) or
// runs the whole model as one autograd graph (kOneShot, for checking).
//
// Devices. The operators run where their hidden state is (the backbone's
// copy on that device: LlamaWeights::OnDevice). The adapters, their
// gradients and the optimizer state live in host memory: a forward reads a
// copy of the adapters on the device, and every gradient of an adapter comes
// back to the host, where accumulation and the optimizer step run (a LoRA
// adapter is a few MB; the activations, tapes and d(hidden) stay on the
// device). A d(out) from a group on another device is moved to the tape's.
//
// Value semantics. Tensors are never modified in place by these operators:
// steps and copies produce new tensors, so copying a TaskAdapters or a
// TaskState (a handle copy) yields an independent state.
//
// Errors: like llama_ops.h, every function returns Status and never throws
// (LibTorch exceptions come back as Internal / ResourceExhausted); inputs are
// validated first with messages naming the offending tensor and shape. The
// operators run with autograd enabled even when called under
// c10::InferenceMode (they leave it for their own scope).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "slicesched/executor/llama/llama_ops.h"
#include "slicesched/executor/torch/tensor.h"

namespace slicesched::executor {

struct LoraConfig {
  int64_t rank = 8;
  double alpha = 16.0;  // scaling s = alpha / rank

  double scaling() const { return alpha / static_cast<double>(rank); }
  // rank >= 1, alpha finite and > 0.
  absl::Status Validate() const;
};

// The LoRA factors of one decoder layer (all f32).
struct LoraLayer {
  Tensor q_a;  // [rank, hidden]
  Tensor q_b;  // [heads*head_dim, rank]
  Tensor v_a;  // [rank, hidden]
  Tensor v_b;  // [kv_heads*head_dim, rank]
};

// The trainable parameters of one task. The same type also holds
// gradients and AdamW moments (same names and shapes).
struct TaskAdapters {
  LoraConfig lora;
  std::vector<LoraLayer> layers;  // one per decoder layer of the backbone
  Tensor head;                    // [outputs, hidden]

  int64_t head_outputs() const;  // 0 when the head is undefined
  // All tensors in a fixed order under stable names:
  // "layers.{i}.{q_a,q_b,v_a,v_b}", then "head".
  std::vector<std::pair<std::string, Tensor>> NamedTensors() const;
  int64_t NumParams() const;
  // Every tensor defined, f32, with the shapes above for `dims`.
  absl::Status Check(const LlamaDims& dims) const;

  // Seeded init (A ~ N(0, 1/hidden), B = 0, head ~ N(0, 1/hidden)) from a
  // generator private to this call. head_outputs >= 1.
  static absl::StatusOr<TaskAdapters> Init(const LlamaDims& dims, const LoraConfig& lora,
                                           int64_t head_outputs, uint64_t seed);
  // All zeros with the shapes of `like` (gradient / moment buffers).
  static absl::StatusOr<TaskAdapters> ZerosLike(const TaskAdapters& like);
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // decoupled (Loshchilov & Hutter), on every adapter tensor
  // Linear warm-up: the step taken at the state's step k < warmup_steps uses
  // lr (k + 1) / warmup_steps (a fresh zero head and untrained adapters
  // otherwise take their largest steps on their noisiest gradients). It
  // counts the state's own steps, so a temporal target (TransferLora
  // restarts the optimizer) warms up again. 0 = constant lr.
  int64_t warmup_steps = 0;
  double LrAt(int64_t step) const {
    return step < warmup_steps ? lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps) : lr;
  }
  absl::Status Validate() const;
};

// The optimizer of a task's steps (OptimizerStep).
enum class OptimizerKind : uint8_t {
  kAdamW,  // AdamWStep (the default)
  kSgd,    // SgdStep: SGD with momentum, lr and weight_decay from `adamw`
};

// Everything a task's training needs to resume exactly: its parameters, its
// own optimizer state (AdamW moments, or the SGD momentum buffer in `m`) and
// step count, and the gradients accumulated since the last step.
struct TaskState {
  TaskAdapters params;
  AdamWOptions adamw;  // lr and weight_decay serve SGD too
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  double momentum = 0.9;  // SGD's momentum, in [0, 1)
  int64_t step = 0;         // optimizer steps taken
  TaskAdapters m;           // first moments
  TaskAdapters v;           // second moments
  TaskAdapters grad_sum;    // sum of the accumulated micro-batch gradients
  int64_t accumulated = 0;  // micro-batches in grad_sum

  // Fresh parameters from `seed`, zero moments, nothing accumulated.
  static absl::StatusOr<TaskState> Init(const LlamaDims& dims, const LoraConfig& lora,
                                        int64_t head_outputs, uint64_t seed,
                                        const AdamWOptions& adamw = {});
  absl::Status Check(const LlamaDims& dims) const;
};

// Labels for the next-token objective: labels[b, s] = tokens[b, s+1], -1 at
// the last position. tokens int64 [B, S].
absl::StatusOr<Tensor> NextTokenLabels(const Tensor& tokens);
// Labels for sequence classification: class[b] at position S-1, -1 elsewhere.
absl::StatusOr<Tensor> LastPositionLabels(std::span<const int64_t> classes, int64_t seq_len);

struct TrainBatch {
  Tensor tokens;  // int64 [B, S]
  Tensor labels;  // int64 [B, S], -1 = no loss; else in [0, head outputs of the row's task)
  // Per row, the index of its task in the call's task list; empty = every
  // row belongs to task 0.
  std::vector<int64_t> row_task;
  // Per row, its number of leading pad positions (a row left-padded to the
  // batch's longest row); empty = no padding. See "Padding" above.
  std::vector<int64_t> row_pad;
};

// --- Per-group operators (the pipeline split) ------------------------------

// What TrainGroupBackward needs from a group's forward (the autograd graph
// and its leaves). Opaque; holds tensors of the device that ran the forward.
// Single use: a second backward fails with FailedPrecondition.
class GroupTape;

struct GroupForwardResult {
  Tensor hidden_out;  // [B, S, hidden], model dtype, no autograd history
  std::shared_ptr<GroupTape> tape;
};

// The training forward of fused group `group` on hidden [B, S, hidden]
// (positions 0..S-1, causal, no KV cache). `tasks` are the adapter slots
// (row_task indexes them; every TaskAdapters must fit `base`'s dims, and all
// must have the same LoRA config, rank and alpha). `row_pad`: the rows'
// leading pad positions (empty: none; see "Padding").
absl::StatusOr<GroupForwardResult> TrainGroupForward(const LlamaWeights& base, int64_t group,
                                                     std::span<const TaskAdapters* const> tasks,
                                                     std::span<const int64_t> row_task,
                                                     const Tensor& hidden,
                                                     std::span<const int64_t> row_pad = {});

struct GroupBackwardResult {
  Tensor d_hidden_in;  // [B, S, hidden], model dtype
  // grads[t][l]: the gradient for slot t of layer group*fusion+l.
  std::vector<std::vector<LoraLayer>> grads;
};

// Backward of one group: d_hidden_out [B, S, hidden] (the gradient of the
// total loss w.r.t. the group's output) -> d(input) and the LoRA gradients.
absl::StatusOr<GroupBackwardResult> TrainGroupBackward(GroupTape& tape, const Tensor& d_hidden_out);

struct HeadLossResult {
  std::vector<double> loss;      // per slot: mean CE over its labelled positions (0 if none)
  std::vector<int64_t> counted;  // per slot: labelled positions
  Tensor d_hidden;               // d(sum of the slots' losses) / d(hidden), model dtype
  std::vector<Tensor> d_head;    // per slot, [outputs, hidden]
};

// Final norm, each row's task head and the loss, with the head's backward:
// hidden [B, S, hidden] is the output of the last group. Labels at a row's
// pad positions (`row_pad`, empty: none) are ignored.
absl::StatusOr<HeadLossResult> TrainHeadLoss(const LlamaWeights& base,
                                             std::span<const TaskAdapters* const> tasks,
                                             std::span<const int64_t> row_task,
                                             const Tensor& hidden, const Tensor& labels,
                                             std::span<const int64_t> row_pad = {});

// --- Whole-step composition ------------------------------------------------

enum class GradientPath {
  kPipelined,  // group by group, passing only hidden states and their gradients
  kOneShot,    // one autograd graph over all groups, one backward call
};

struct TaskGradients {
  std::vector<TaskAdapters> grads;  // per task: the gradient of its own loss
  std::vector<double> loss;         // per task
  std::vector<int64_t> counted;     // per task
};

absl::StatusOr<TaskGradients> ComputeGradients(const LlamaWeights& base,
                                               std::span<const TaskAdapters* const> tasks,
                                               const TrainBatch& batch,
                                               GradientPath path = GradientPath::kPipelined);

// --- Optimizer ---------------------------------------------------------------

// Adds one micro-batch gradient to state.grad_sum (new tensors) and counts it.
absl::Status AccumulateGradients(TaskState& state, const TaskAdapters& grad);

// One AdamW step on the mean of the accumulated gradients (grad_sum /
// accumulated), with bias correction; clears the accumulation.
// FailedPrecondition when nothing was accumulated.
//   g = grad_sum / n;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p = p (1 - lr wd) - lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
absl::Status AdamWStep(TaskState& state);

// One SGD-with-momentum step (PyTorch's torch.optim.SGD, dampening 0,
// coupled weight decay) on the mean of the accumulated gradients, for every
// adapter tensor and the head; clears the accumulation. The momentum buffer
// is state.m (v stays zero); lr and weight_decay are state.adamw's:
//   g = grad_sum / n + wd p;  m = momentum m + g;  p = p - lr m
// (m starts at zero, so the first step's buffer is g, as in PyTorch).
// FailedPrecondition when nothing was accumulated; InvalidArgument for a
// momentum outside [0, 1) or a negative / non-finite lr or weight_decay.
absl::Status SgdStep(TaskState& state);

// The task's own optimizer step: AdamWStep or SgdStep by state.optimizer.
absl::Status OptimizerStep(TaskState& state);

// Convenience: ComputeGradients on a single-task batch, AccumulateGradients;
// returns the loss. (AdamWStep is separate: call it every N micro-batches.)
absl::StatusOr<double> AccumulateMicroBatch(const LlamaWeights& base, TaskState& state,
                                            const TrainBatch& batch);

// --- Spatial joint training ------------------------------------------------
//
// Two (or more) tasks train one shared LoRA adapter, each with its own head,
// on batches that mix their rows. The joint state is simply the tasks' own
// TaskStates, whose LoRA layers hold identical values (the shared adapter);
// each keeps its own head, moments, step count and accumulated gradients.
// A joint step is defined as:
//
//   for each task t: t's own optimizer step (OptimizerStep: AdamW, or SGD
//                    with momentum) of t's state (shared LoRA + own head) on
//                    t's own accumulated gradients with t's own moments;
//   shared LoRA    = the element-wise mean over tasks of the stepped LoRA.
//
// i.e. exactly the mean of the tasks' solo steps from the same state, while
// each task's moments evolve exactly as in its solo step. Decoupling is then
// lossless by construction: task t's TaskState at any point IS an independent
// task (its copy of the shared adapter, its own optimizer state), and it
// continues alone with plain AdamWStep.

// Makes `tasks` share one adapter: every task's LoRA layers become (copies of)
// those of tasks[0]; heads and optimizer states are kept.
absl::Status ShareLora(std::span<TaskState* const> tasks);

// Whether `a` and `b` hold one shared adapter (as ShareLora leaves them): the
// same LoRA config and layer count and bit-identical LoRA factors (q_a, q_b,
// v_a, v_b of every layer, shapes and values); the heads may differ. OK when
// they do, else FailedPrecondition naming the first difference ("different
// LoRA configs (...)", "different LoRA factors (layer L differs)").
absl::Status SameAdapter(const TaskAdapters& a, const TaskAdapters& b);

// Joint micro-batch: gradients for every task from one mixed batch
// (batch.row_task indexes `tasks`), each accumulated into its own state.
// Returns the per-task losses.
absl::StatusOr<std::vector<double>> AccumulateJointMicroBatch(const LlamaWeights& base,
                                                              std::span<TaskState* const> tasks,
                                                              const TrainBatch& batch);

// How the tasks' solo steps of the shared adapter are combined (the heads,
// moments and step counts are per task either way, so decoupling is lossless
// under both rules):
//   kMean: shared LoRA = the element-wise mean of the stepped LoRA (above);
//          every task's data moves the adapter by 1/n of its solo step, so a
//          pair at best trains as fast as one task alone (the daemon's rule).
//   kSum:  shared LoRA = shared + the SUM over tasks of (stepped_t - shared),
//          i.e. each task applies its own full optimizer update to the shared
//          adapter, as in multi-task training on the summed loss with an
//          optimizer per task: a related partner adds a step in the same
//          direction (faster), an unrelated one a step across it, a
//          conflicting one a step against it.
enum class JointStepRule { kMean, kSum };

// The joint step above. FailedPrecondition when the tasks' LoRA values differ
// (they do not share an adapter) or a task has nothing accumulated. The
// tasks' step counts may differ: each task's optimizer keeps its own step
// (AdamW's bias correction) and moments.
absl::Status JointOptimizerStep(std::span<TaskState* const> tasks,
                                JointStepRule rule = JointStepRule::kMean);

// --- Temporal transfer -------------------------------------------------------

// Initialises `to`'s LoRA layers from `from`'s trained ones (copied values;
// later training of either does not affect the other). `to` keeps its own
// head, and its optimizer state restarts (zero moments, step 0, nothing
// accumulated): B's training is its own. Shapes and ranks must match.
absl::Status TransferLora(const TaskState& from, TaskState& to);

// --- Checkpoints ---------------------------------------------------------------

// Writes the whole TaskState (parameters, moments, accumulated gradients as
// f32 tensors under "params.*", "m.*", "v.*", "grad_sum.*"; step,
// accumulated, LoRA config and AdamW options as exact metadata) to a
// safetensors file; the optimizer kind and SGD momentum too ("optimizer",
// "sgd_momentum"; a file without them is an AdamW state). Restoring gives a
// bit-identical state.
absl::Status SaveTaskCheckpoint(const std::string& path, const TaskState& state);
absl::StatusOr<TaskState> LoadTaskCheckpoint(const std::string& path, const LlamaDims& dims);

// --- Reference for tests -------------------------------------------------------

struct ReferenceTrainResult {
  std::vector<double> loss;         // per task
  std::vector<TaskAdapters> grads;  // per task, f64 tensors
};

// An independent, plain implementation of the training objective in f64: for
// each row the merged weights W + s B A of its task, layer by layer with full
// causal attention written per head (no code shared with train_ops.cc), the
// whole model as one autograd graph. `perturb` (optional) adds `delta` (in
// f64) to one coordinate of one task's tensor before the forward, for finite
// differences: {task, tensor name as in NamedTensors, flat index, delta}.
struct ReferencePerturbation {
  int64_t task = 0;
  std::string name;
  int64_t index = 0;
  double delta = 0.0;
};
absl::StatusOr<ReferenceTrainResult> ReferenceTrainLoss(
    const LlamaWeights& base, std::span<const TaskAdapters* const> tasks, const TrainBatch& batch,
    const std::optional<ReferencePerturbation>& perturb = std::nullopt);

}  // namespace slicesched::executor
