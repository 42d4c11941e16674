#include "slicesched/experiments/fidelity.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "slicesched/common/clock.h"
#include "slicesched/common/json.h"
#include "slicesched/common/option_checks.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/estimate/calibration.h"
#include "slicesched/estimate/estimators.h"
#include "slicesched/executor/runtime/executor.h"
#include "slicesched/executor/kernels/llama_kernels.h"
#include "slicesched/executor/llama/llama_ops.h"
#include "slicesched/executor/train/train_ops.h"
#include "slicesched/gmg/gmg.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/gmg/placement.h"
#include "slicesched/sched/learner.h"
#include "slicesched/sim/simulator.h"

namespace slicesched {

namespace {

std::string KindJson(const FidelityKindResult& k) {
  auto list = [](const std::vector<double>& v) { return JsonNumberList(v, 3); };
  return absl::StrFormat(
      "{\"iterations\": %d, \"predicted_ms\": %.4f, \"measured_ms\": %.4f, \"error_pct\": %.2f, "
      "\"mean_abs_error_pct\": %.2f, \"transfers_per_iteration\": %.2f, \"launch_gap_ms\": %.4f, "
      "\"delivery_gap_ms\": %.4f, \"predicted_runs_ms\": %s, \"measured_runs_ms\": %s}",
      k.iterations, k.predicted_ms, k.measured_ms, k.error_pct, k.mean_abs_error_pct,
      k.transfers_per_iteration, k.launch_gap_ms, k.delivery_gap_ms, list(k.predicted_runs_ms),
      list(k.measured_runs_ms));
}

// Fills the means and errors of `k` from its per-iteration runs.
void Summarize(FidelityKindResult& k) {
  k.iterations = static_cast<int64_t>(k.measured_runs_ms.size());
  if (k.iterations == 0) return;
  double p = 0, m = 0, abs_pct = 0;
  for (size_t i = 0; i < k.measured_runs_ms.size(); ++i) {
    p += k.predicted_runs_ms[i];
    m += k.measured_runs_ms[i];
    abs_pct += 100.0 * std::abs(k.predicted_runs_ms[i] - k.measured_runs_ms[i]) /
               k.measured_runs_ms[i];
  }
  const double n = static_cast<double>(k.iterations);
  k.predicted_ms = p / n;
  k.measured_ms = m / n;
  k.error_pct = k.measured_ms > 0 ? 100.0 * std::abs(k.predicted_ms - k.measured_ms) / k.measured_ms : 0;
  k.mean_abs_error_pct = abs_pct / n;
  auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
  };
  k.transfers_per_iteration = static_cast<double>(k.launch_gaps_ms.size()) / n;
  k.launch_gap_ms = mean(k.launch_gaps_ms);
  k.delivery_gap_ms = mean(k.delivery_gaps_ms);
}

using executor::LlamaKernelRunner;
using executor::ExecutorOptions;
using executor::ExecutorSet;
using executor::HostTransferBackend;
using executor::LlamaRequest;
using executor::LlamaTrainJob;
using executor::LlamaTrainRequest;
using executor::LlamaWeights;
using executor::Tensor;

// Deterministic token ids in [0, vocab).
std::vector<int64_t> Tokens(int64_t n, int64_t vocab, uint64_t* state) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint64_t& x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out.push_back(static_cast<int64_t>(x % static_cast<uint64_t>(vocab)));
  }
  return out;
}

const CandidatePartition* FindPartition(const GraphTemplate& t, absl::string_view name) {
  for (const CandidatePartition& p : t.partitions()) {
    if (p.name == ToStd(name)) return &p;
  }
  return nullptr;
}

// What an iteration is for: warm-up (run, not learned from), calibration
// (learned from, not scored) or scored (learned from after its prediction).
enum class Phase { kWarmup, kCalibrate, kScore };

// Per-operator sums over the scored iterations.
struct OpAccumulator {
  int device = 0;
  int64_t n = 0;
  double predicted = 0, measured = 0, abs_pct = 0, abs_ms = 0;
  void Add(double predicted_ms, double measured_ms) {
    ++n;
    predicted += predicted_ms;
    measured += measured_ms;
    abs_ms += std::abs(predicted_ms - measured_ms);
    if (measured_ms > 0) abs_pct += 100.0 * std::abs(predicted_ms - measured_ms) / measured_ms;
  }
};

// The two-device rig: GMG, executors, estimators, learner.
class FidelityRig {
 public:
  static absl::StatusOr<std::unique_ptr<FidelityRig>> Create(const FidelityOptions& o) {
    SLICESCHED_ASSIGN_OR_RETURN(LlamaDims dims, LlamaPreset(o.model));
    if (dims.num_groups() < 2) {
      return absl::InvalidArgumentError(
          StrCat("fidelity: model '", o.model, "' has one fused group; pp2 needs two"));
    }
    const bool cuda = o.device == "cuda";
    if (cuda) SLICESCHED_RETURN_IF_ERROR(Annotate(executor::CheckCudaDevice(0), "--device cuda"));
    std::vector<DeviceSpec> devs(2);
    for (int d = 0; d < 2; ++d) {
      devs[d].name = StrCat(cuda ? "gpu" : "cpu", d);
      devs[d].type = cuda ? "cuda" : "cpu";
      devs[d].memory = Bytes::GiB(8);
      devs[d].backend = cuda ? DeviceBackend::kCuda : DeviceBackend::kCpu;
      devs[d].ordinal = 0;  // both on GPU 0 (cuda)
    }
    SLICESCHED_ASSIGN_OR_RETURN(AcceleratorSet accel,
                                AcceleratorSet::Create(devs, LinkSpec{10e9, Duration::Micros(5)}));
    SLICESCHED_ASSIGN_OR_RETURN(std::shared_ptr<const LlamaWeights> w,
                                LlamaWeights::FromSeed(dims, o.seed));
    SLICESCHED_ASSIGN_OR_RETURN(std::unique_ptr<LlamaKernelRunner> runner,
                                LlamaKernelRunner::Create(w, dims));
    auto rig = std::unique_ptr<FidelityRig>(new FidelityRig(dims, std::move(accel), std::move(runner)));
    if (cuda) {
      const std::vector<executor::TensorDevice> gpu(2, executor::TensorDevice::Cuda(0));
      SLICESCHED_RETURN_IF_ERROR(rig->runner_->Place(gpu));
      rig->transfers_.Place(gpu);
    }
    SLICESCHED_RETURN_IF_ERROR(rig->Init(o));
    return rig;
  }

  // One training iteration of `phase`; recorded into `out` when scored.
  absl::Status TrainIteration(Phase phase, FidelityKindResult* out) {
    SLICESCHED_ASSIGN_OR_RETURN(executor::TrainBatch batch, NextBatch());
    SLICESCHED_ASSIGN_OR_RETURN(
        InstanceId id, g_.Instantiate(LlamaTrainStep(train_, o_.train_batch, o_.train_tokens, o_.lora_rank,
                                                     o_.head_outputs, PriorityClass::kOffline, clock_.Now())));
    runner_->SetTrainRequest(id, LlamaTrainRequest{job_, std::move(batch)});
    SLICESCHED_RETURN_IF_ERROR(RunIteration({id}, phase, out));
    runner_->EraseRequest(id);
    return absl::OkStatus();
  }

  // One serving iteration: a new conversation's prefill plus a decode step of
  // every conversation still generating; recorded into `out` when scored.
  absl::Status ServeIteration(Phase phase, FidelityKindResult* out) {
    std::vector<InstanceId> ids;
    // Decode steps of the live conversations.
    std::vector<std::pair<InstanceId, size_t>> decodes;
    for (size_t c = 0; c < convs_.size(); ++c) {
      Conversation& cv = convs_[c];
      SLICESCHED_ASSIGN_OR_RETURN(
          InstanceId id, g_.Instantiate(LlamaDecodeStep(decode_, cv.context, cv.kv, PriorityClass::kOnline,
                                                        clock_.Now())));
      const std::vector<int64_t> last = {cv.last_token};
      runner_->SetRequest(id, LlamaRequest{Tensor::FromInt64(last, {1, 1}), executor::SamplingParams{}});
      ids.push_back(id);
      decodes.emplace_back(id, c);
    }
    // The new conversation's prefill.
    InstanceSpec ps;
    ps.template_id = prefill_;
    ps.bindings = {{"B", 1}, {"S", o_.prompt_tokens}};
    ps.priority_class = PriorityClass::kOnline;
    ps.arrival = clock_.Now();
    SLICESCHED_ASSIGN_OR_RETURN(InstanceId pid, g_.Instantiate(ps));
    const std::vector<int64_t> prompt = Tokens(o_.prompt_tokens, dims_.vocab, &rng_);
    runner_->SetRequest(pid, LlamaRequest{Tensor::FromInt64(prompt, {1, o_.prompt_tokens}),
                                          executor::SamplingParams{}});
    ids.push_back(pid);

    SLICESCHED_RETURN_IF_ERROR(RunIteration(ids, phase, out));

    for (InstanceId id : ids) runner_->EraseRequest(id);
    for (const auto& [id, c] : decodes) {
      Conversation& cv = convs_[c];
      SLICESCHED_ASSIGN_OR_RETURN(cv.last_token, TokenOf(id));
      ++cv.context;
      ++cv.steps;
    }
    // Conversations that are done release their KV checkpoints.
    for (auto it = convs_.begin(); it != convs_.end();) {
      if (it->steps >= o_.decode_steps) {
        for (CheckpointId k : it->kv) SLICESCHED_RETURN_IF_ERROR(g_.ReleaseCheckpoint(k));
        it = convs_.erase(it);
      } else {
        ++it;
      }
    }
    Conversation fresh;
    fresh.kv = produced_[pid.value()];
    fresh.context = o_.prompt_tokens;
    SLICESCHED_ASSIGN_OR_RETURN(fresh.last_token, TokenOf(pid));
    convs_.push_back(std::move(fresh));
    produced_.clear();
    {
      absl::MutexLock l(&mu_);
      sampled_.clear();
    }
    SLICESCHED_RETURN_IF_ERROR(exec_->Dispatch(clock_.Now()));  // frees released buffers
    return g_.VerifyInvariants();
  }

  // Releases every conversation's checkpoints.
  absl::Status Finish() {
    for (const Conversation& cv : convs_) {
      for (CheckpointId k : cv.kv) SLICESCHED_RETURN_IF_ERROR(g_.ReleaseCheckpoint(k));
    }
    convs_.clear();
    SLICESCHED_RETURN_IF_ERROR(exec_->Dispatch(clock_.Now()));
    if (exec_->failed_nodes() != 0) {
      return absl::InternalError(StrCat("fidelity: ", exec_->failed_nodes(), " nodes failed"));
    }
    return g_.VerifyInvariants();
  }

  const OnlineLearner& learner() const { return learner_; }
  const RuntimeCalibration& calibration() const { return calibration_; }
  // Per-operator results of the scored iterations, by name.
  std::vector<FidelityOpStat> OpStats() const {
    std::vector<FidelityOpStat> out;
    for (const auto& [name, a] : op_stats_) {
      if (a.n == 0) continue;
      const double n = static_cast<double>(a.n);
      out.push_back(FidelityOpStat{name, a.device, a.n, a.predicted / n, a.measured / n, a.abs_pct / n});
    }
    return out;
  }
  // Sum of |predicted - measured| over sum of measured, over every scored
  // operator (not hops).
  double OpWapePct() const {
    double abs_ms = 0, measured = 0;
    for (const auto& [name, a] : op_stats_) {
      if (name.rfind("hop ", 0) == 0) continue;
      abs_ms += a.abs_ms;
      measured += a.measured;
    }
    return measured > 0 ? 100.0 * abs_ms / measured : 0.0;
  }
  // The hand-off time the transfer estimator adds to a hop src -> dst.
  double LearnedHandoffMs(DeviceId src, DeviceId dst) const {
    return (transfer_est_.launch_gap_ns(src, dst) + transfer_est_.delivery_gap_ns(dst)) / 1e6;
  }

 private:
  struct Conversation {
    std::vector<CheckpointId> kv;
    int64_t context = 0;  // tokens in the KV caches
    int64_t last_token = 0;
    int steps = 0;
  };

  FidelityRig(const LlamaDims& dims, AcceleratorSet accel, std::unique_ptr<LlamaKernelRunner> runner)
      : dims_(dims),
        g_(std::move(accel)),
        runner_(std::move(runner)),
        transfer_est_(g_.accelerators()),
        calibration_(g_.accelerators()),
        ctx_(&g_.templates(), &op_est_, &transfer_est_),
        learner_(&g_, &ctx_, &op_est_, &transfer_est_, &calibration_) {}

  absl::Status Init(const FidelityOptions& o) {
    o_ = o;
    rng_ = 88172645463325252ull ^ (o.seed * 0x9e3779b97f4a7c15ull);
    SLICESCHED_ASSIGN_OR_RETURN(LlamaTemplates t, BuildLlamaTemplates(dims_));
    SLICESCHED_ASSIGN_OR_RETURN(std::shared_ptr<const GraphTemplate> train, BuildLlamaTrainTemplate(dims_));
    SLICESCHED_ASSIGN_OR_RETURN(prefill_, g_.RegisterTemplate(t.prefill));
    SLICESCHED_ASSIGN_OR_RETURN(decode_, g_.RegisterTemplate(t.decode));
    SLICESCHED_ASSIGN_OR_RETURN(train_, g_.RegisterTemplate(train));
    for (const GraphTemplate* tpl : {t.prefill.get(), t.decode.get(), train.get()}) {
      const CandidatePartition* p = FindPartition(*tpl, "pp2");
      if (p == nullptr) return absl::InternalError(StrCat("fidelity: template ", tpl->name(), " has no pp2"));
      for (int op = 0; op < tpl->num_ops(); ++op) {
        const OpSpec& spec = tpl->op(op);
        if (spec.weight_key.empty()) continue;
        const DeviceId d(static_cast<uint16_t>(p->slot_of_op[static_cast<size_t>(op)]));
        if (g_.HasWeights(d, spec.weight_key)) continue;
        SLICESCHED_RETURN_IF_ERROR(g_.LoadWeights(d, spec.weight_key, spec.weight_bytes));
      }
    }
    SLICESCHED_ASSIGN_OR_RETURN(
        executor::TaskState init,
        executor::TaskState::Init(dims_, executor::LoraConfig{o.lora_rank, 2.0 * static_cast<double>(o.lora_rank)},
                                  o.head_outputs, o.seed));
    job_ = std::make_shared<LlamaTrainJob>();
    {
      absl::MutexLock l(&job_->mu);
      job_->state = std::move(init);
    }
    job_->accumulation = 1;  // an AdamW step every iteration
    calibration_.set_drift_smoothing(o.drift_smoothing);
    ctx_.set_calibration(&calibration_);
    runner_->SetTokenSink([this](InstanceId inst, const Tensor& tokens) {
      const std::vector<int64_t> v = tokens.ToInt64();
      absl::MutexLock l(&mu_);
      sampled_[inst.value()] = v.empty() ? -1 : v[0];
    });
    exec_ = std::make_unique<ExecutorSet>(&g_, &clock_, runner_.get(), &transfers_);
    return absl::OkStatus();
  }

  absl::StatusOr<executor::TrainBatch> NextBatch() {
    const int64_t b = o_.train_batch, s = o_.train_tokens;
    const std::vector<int64_t> ids = Tokens(b * s, dims_.vocab, &rng_);
    std::vector<int64_t> cls;
    for (int64_t r = 0; r < b; ++r) cls.push_back(ids[static_cast<size_t>(r * s + s - 1)] % o_.head_outputs);
    executor::TrainBatch out;
    out.tokens = Tensor::FromInt64(ids, {b, s});
    SLICESCHED_ASSIGN_OR_RETURN(out.labels, executor::LastPositionLabels(cls, s));
    return out;
  }

  absl::StatusOr<int64_t> TokenOf(InstanceId id) {
    absl::MutexLock l(&mu_);
    auto it = sampled_.find(id.value());
    if (it == sampled_.end()) return absl::InternalError(StrCat("fidelity: instance ", id, " sampled nothing"));
    return it->second;
  }

  // Issues `ids` by pp2, predicts the iteration from the snapshot, runs it on
  // the executors to retirement and records both.
  absl::Status RunIteration(const std::vector<InstanceId>& ids, Phase phase, FidelityKindResult* out) {
    const bool score = phase == Phase::kScore;
    const DeviceId slots[2] = {DeviceId(0), DeviceId(1)};
    std::vector<NodeId> issued;
    for (InstanceId id : ids) {
      const Instance* inst = g_.FindInstance(id);
      const CandidatePartition* p = FindPartition(*inst->tpl, "pp2");
      SLICESCHED_ASSIGN_OR_RETURN(std::vector<NodeId> n, IssueByPartition(g_, id, *p, slots, 0, clock_.Now()));
      issued.insert(issued.end(), n.begin(), n.end());
    }
    // The iteration's transfers: (transfer, producer, consumer).
    std::vector<std::array<uint64_t, 3>> xfers;
    for (NodeId n : issued) {
      if (!IsTransferId(n)) continue;
      const OpNode* t = g_.FindNode(n);
      xfers.push_back({n.value(), t->src_node.value(), t->consumer.value()});
    }
    std::map<uint64_t, std::pair<Timestamp, Timestamp>> times;  // node -> (start, end)
    // The prediction, from the snapshot at the iteration's start.
    g_.SnapshotInto(clock_.Now(), &snap_);
    if (sim_.has_value()) {
      SLICESCHED_RETURN_IF_ERROR(sim_->Rebuild(snap_, ctx_));
    } else {
      SLICESCHED_ASSIGN_OR_RETURN(Simulator sim, Simulator::Create(snap_, ctx_));
      sim_.emplace(std::move(sim));
    }
    sim_->RunOnceInto(SimOptions{}, &scratch_, &result_);
    int64_t predicted_end = -1;
    for (size_t i = 0; i < snap_.instances.size(); ++i) {
      if (std::find(ids.begin(), ids.end(), InstanceId(snap_.instances[i].id)) == ids.end()) continue;
      if (result_.instance_end_ns[i] < 0) {
        return absl::InternalError(StrCat("fidelity: the simulator did not complete instance ",
                                          snap_.instances[i].id));
      }
      predicted_end = std::max(predicted_end, result_.instance_end_ns[i]);
    }
    const double predicted_ms = static_cast<double>(predicted_end - result_.start_ns) / 1e6;

    // The measurement.
    const Timestamp t0 = clock_.Now();
    for (NodeId n : issued) exec_->NodeIssued(n);
    SLICESCHED_RETURN_IF_ERROR(exec_->Dispatch(clock_.Now()));
    size_t left = ids.size();
    Timestamp last_end = t0;
    while (left > 0) {
      if (!exec_->WaitForFinish(absl::Seconds(120))) {
        return absl::DeadlineExceededError("fidelity: no completion within 120 s");
      }
      feedback_.clear();
      SLICESCHED_RETURN_IF_ERROR(exec_->AdvanceTo(clock_.Now(), &feedback_));
      for (const Feedback& f : feedback_) {
        last_end = std::max(last_end, f.end);
        times[f.node.value()] = {f.start, f.end};
        // Warm-up feedback (LibTorch's lazy initialisation, first-call
        // allocations, cold caches: up to 100x an operator's steady time)
        // is not learned from: it describes no later run.
        if (phase != Phase::kWarmup) learner_.Apply(f, score);
      }
      for (RetiredInstance& r : g_.TakeRetired()) {
        if (r.state != InstanceState::kDone) {
          return absl::InternalError(StrCat("fidelity: instance ", r.id, " ", InstanceStateName(r.state),
                                            ": ", r.failure));
        }
        produced_[r.id.value()] = std::move(r.produced);
        --left;
      }
    }
    if (score) {
      out->predicted_runs_ms.push_back(predicted_ms);
      out->measured_runs_ms.push_back(static_cast<double>((last_end - t0).nanos()) / 1e6);
      // Per operator (and per hop): the simulator's predicted duration of
      // the node (for a hop: link time plus hand-off gaps, start of the
      // transfer to its bytes reaching the consumer) against the executors'.
      for (size_t i = 0; i < snap_.nodes.size(); ++i) {
        const GmgSnapshot::Node& sn = snap_.nodes[i];
        const auto it = times.find(sn.id);
        if (it == times.end() || result_.node_start_ns[i] < 0 || result_.node_end_ns[i] < 0) continue;
        std::string name;
        double sim_ms = static_cast<double>(result_.node_end_ns[i] - result_.node_start_ns[i]) / 1e6;
        double meas_ms = static_cast<double>((it->second.second - it->second.first).nanos()) / 1e6;
        if (sn.op_index >= 0) {
          const GraphTemplate* tpl = g_.templates().Find(TemplateId(snap_.instances[sn.instance].template_id));
          if (tpl == nullptr) continue;
          name = StrCat(tpl->name(), "/", tpl->op(sn.op_index).name);
        } else {
          // A hop: from the transfer's start to its consumer's start.
          if (sn.consumer == GmgSnapshot::kNone) continue;
          const auto ct = times.find(snap_.nodes[sn.consumer].id);
          if (ct == times.end() || result_.node_start_ns[sn.consumer] < 0) continue;
          const GmgSnapshot::Node& cn = snap_.nodes[sn.consumer];
          const GraphTemplate* ctpl = g_.templates().Find(TemplateId(snap_.instances[cn.instance].template_id));
          name = StrCat("hop cpu", sn.device, " -> cpu", cn.device, " to ",
                        ctpl != nullptr ? StrCat(ctpl->name(), "/", ctpl->op(cn.op_index).name) : "?");
          sim_ms = static_cast<double>(result_.node_start_ns[sn.consumer] - result_.node_start_ns[i]) / 1e6;
          meas_ms = static_cast<double>((ct->second.first - it->second.first).nanos()) / 1e6;
        }
        OpAccumulator& acc = op_stats_[name];
        acc.device = sn.device;
        acc.Add(sim_ms, meas_ms);
      }
      for (const auto& [x, src, consumer] : xfers) {
        const auto xt = times.find(x), st = times.find(src), ct = times.find(consumer);
        if (xt == times.end() || st == times.end() || ct == times.end()) continue;
        out->launch_gaps_ms.push_back(static_cast<double>((xt->second.first - st->second.second).nanos()) / 1e6);
        out->delivery_gaps_ms.push_back(static_cast<double>((ct->second.first - xt->second.second).nanos()) / 1e6);
      }
    }
    return absl::OkStatus();
  }

  LlamaDims dims_;
  FidelityOptions o_;
  uint64_t rng_ = 0;
  SteadyClock clock_;
  GlobalMappingGraph g_;
  std::unique_ptr<LlamaKernelRunner> runner_;
  executor::LlamaTransferBackend transfers_;
  OpEstimator op_est_;
  TransferEstimator transfer_est_;
  RuntimeCalibration calibration_;
  SimContext ctx_;
  OnlineLearner learner_;
  TemplateId prefill_, decode_, train_;
  std::shared_ptr<LlamaTrainJob> job_;
  std::vector<Conversation> convs_;
  std::map<uint64_t, std::vector<CheckpointId>> produced_;
  absl::Mutex mu_;
  std::map<uint64_t, int64_t> sampled_ ABSL_GUARDED_BY(mu_);
  GmgSnapshot snap_;
  std::optional<Simulator> sim_;  // rebuilt every iteration
  SimScratch scratch_;
  SimResult result_;
  std::vector<Feedback> feedback_;
  std::map<std::string, OpAccumulator> op_stats_;
  std::unique_ptr<ExecutorSet> exec_;  // last: stopped first
};

}  // namespace

std::string FidelityResult::ToJson() const {
  std::string op_list = "[";
  for (size_t i = 0; i < ops.size(); ++i) {
    const FidelityOpStat& o = ops[i];
    op_list += absl::StrFormat(
        "%s{\"name\": \"%s\", \"device\": %d, \"samples\": %d, \"predicted_ms\": %.4f, "
        "\"measured_ms\": %.4f, \"mape_pct\": %.2f}",
        i ? ", " : "", o.name, o.device, o.samples, o.predicted_ms, o.measured_ms, o.mape_pct);
  }
  op_list += "]";
  return absl::StrFormat(
      "{\"model\": \"%s\", \"device\": \"%s\", \"devices\": %d, \"placement\": \"%s\", \"warmup_iterations\": %d, "
      "\"calibration_iterations\": %d, "
      "\"train\": %s, \"serve\": %s, \"overall\": %s, \"op_mape_pct\": %.2f, "
      "\"transfer_mape_pct\": %.2f, \"op_wape_pct\": %.2f, \"learned_handoff_ms\": [%.4f, %.4f], "
      "\"device_factors\": [%.4f, %.4f], \"drift_factor\": %.4f, \"overlap_factor\": %.4f, "
      "\"transfer_overlap_factor\": %.4f, \"ops\": %s, \"target_error_pct\": %.2f, \"target_met\": %s}",
      model, device, devices, placement, warmup, calibration, KindJson(train), KindJson(serve), KindJson(overall),
      op_mape_pct, transfer_mape_pct, op_wape_pct, learned_handoff_01_ms, learned_handoff_10_ms,
      device_factors.size() > 0 ? device_factors[0] : 1.0, device_factors.size() > 1 ? device_factors[1] : 1.0,
      drift_factor, overlap_factor, transfer_overlap_factor, op_list, target_error_pct,
      overall.error_pct <= target_error_pct && overall.iterations > 0 ? "true" : "false");
}

absl::Status FidelityOptions::Validate() const {
  SLICESCHED_RETURN_IF_ERROR(CheckAtLeast({{"--iterations", 1, iterations},
                                           {"--warmup", 0, warmup},
                                           {"--calibration", 0, calibration},
                                           {"--decode-steps", 0, decode_steps},
                                           {"--train-batch", 1, train_batch},
                                           {"--train-tokens", 1, train_tokens},
                                           {"--prompt-tokens", 1, prompt_tokens},
                                           {"lora_rank", 1, lora_rank},
                                           {"head_outputs", 1, head_outputs}}));
  if (!(drift_smoothing >= 0 && drift_smoothing <= 1)) {
    return OptionOutOfRange("--drift-smoothing", "in [0, 1]", drift_smoothing);
  }
  if (device != "cpu" && device != "cuda") return OptionOutOfRange("--device", "cpu or cuda", device);
  return absl::OkStatus();
}

absl::StatusOr<FidelityResult> RunFidelity(const FidelityOptions& o) {
  SLICESCHED_RETURN_IF_ERROR(o.Validate());
  SLICESCHED_ASSIGN_OR_RETURN(std::unique_ptr<FidelityRig> rig, FidelityRig::Create(o));
  FidelityResult r;
  r.model = o.model;
  r.device = o.device;
  r.devices = 2;
  r.calibration = o.calibration;
  r.placement = o.device == "cuda" ? "pp2 on 2 logical cuda devices sharing GPU 0 (template partition, explicit)"
                                    : "pp2 on 2 CPU devices (template partition, explicit)";
  r.warmup = o.warmup;
  FidelityKindResult unused;
  for (int i = 0; i < o.warmup; ++i) {
    SLICESCHED_RETURN_IF_ERROR(rig->TrainIteration(Phase::kWarmup, &unused));
    SLICESCHED_RETURN_IF_ERROR(rig->ServeIteration(Phase::kWarmup, &unused));
  }
  for (int i = 0; i < o.calibration; ++i) {
    SLICESCHED_RETURN_IF_ERROR(rig->TrainIteration(Phase::kCalibrate, &unused));
    SLICESCHED_RETURN_IF_ERROR(rig->ServeIteration(Phase::kCalibrate, &unused));
  }
  for (int i = 0; i < o.iterations; ++i) {
    SLICESCHED_RETURN_IF_ERROR(rig->TrainIteration(Phase::kScore, &r.train));
    SLICESCHED_RETURN_IF_ERROR(rig->ServeIteration(Phase::kScore, &r.serve));
  }
  SLICESCHED_RETURN_IF_ERROR(rig->Finish());
  for (const FidelityKindResult* k : {&r.train, &r.serve}) {
    r.overall.predicted_runs_ms.insert(r.overall.predicted_runs_ms.end(), k->predicted_runs_ms.begin(),
                                       k->predicted_runs_ms.end());
    r.overall.measured_runs_ms.insert(r.overall.measured_runs_ms.end(), k->measured_runs_ms.begin(),
                                      k->measured_runs_ms.end());
    r.overall.launch_gaps_ms.insert(r.overall.launch_gaps_ms.end(), k->launch_gaps_ms.begin(),
                                    k->launch_gaps_ms.end());
    r.overall.delivery_gaps_ms.insert(r.overall.delivery_gaps_ms.end(), k->delivery_gaps_ms.begin(),
                                      k->delivery_gaps_ms.end());
  }
  Summarize(r.train);
  Summarize(r.serve);
  Summarize(r.overall);
  r.op_mape_pct = rig->learner().op_error().mape_pct();
  r.transfer_mape_pct = rig->learner().transfer_error().mape_pct();
  r.learned_handoff_01_ms = rig->LearnedHandoffMs(DeviceId(0), DeviceId(1));
  r.learned_handoff_10_ms = rig->LearnedHandoffMs(DeviceId(1), DeviceId(0));
  r.ops = rig->OpStats();
  r.op_wape_pct = rig->OpWapePct();
  for (int d = 0; d < 2; ++d) r.device_factors.push_back(rig->calibration().device_factor(DeviceId(d)));
  r.drift_factor = rig->calibration().drift_factor(DeviceId(0));
  r.overlap_factor = rig->calibration().overlap_factor();
  r.transfer_overlap_factor = rig->calibration().transfer_overlap_factor();
  return r;
}

}  // namespace slicesched
