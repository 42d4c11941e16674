#include "slicesched/executor/overhead.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "slicesched/common/clock.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/estimate/estimators.h"
#include "slicesched/executor/executor.h"
#include "slicesched/executor/llama_kernels.h"
#include "slicesched/executor/llama_ops.h"
#include "slicesched/gmg/gmg.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/sched/slice_scheduler.h"
#include "slicesched/sim/simulator.h"

namespace slicesched {

std::string OverheadResult::ToJson() const {
  auto list = [](const std::vector<double>& v) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += absl::StrFormat("%s%.4f", i ? ", " : "", v[i]);
    return out + "]";
  };
  return absl::StrFormat(
      "{\"prefills\": %d, \"direct_s\": %.4f, \"scheduled_s\": %.4f, \"overhead_pct\": %.2f, "
      "\"repetitions\": %d, \"direct_runs_s\": %s, \"scheduled_runs_s\": %s, "
      "\"per_prefill_direct_us\": %.1f, \"per_prefill_scheduled_us\": %.1f, \"tokens_match\": %s, "
      "\"placement\": \"%s\", \"model\": \"%s\"}",
      prefills, direct_s, scheduled_s, overhead_pct, repetitions, list(direct_runs_s),
      list(scheduled_runs_s), prefills > 0 ? 1e6 * direct_s / static_cast<double>(prefills) : 0.0,
      prefills > 0 ? 1e6 * scheduled_s / static_cast<double>(prefills) : 0.0,
      tokens_match ? "true" : "false", placement, model);
}

namespace {

using executor::LlamaKernelRunner;
using executor::LlamaRequest;
using executor::LlamaWeights;
using executor::Tensor;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// (a) The operators called directly. Returns the sampled token.
absl::StatusOr<int64_t> DirectPrefill(const LlamaWeights& w, const Tensor& tokens) {
  SLICESCHED_ASSIGN_OR_RETURN(Tensor x, executor::Embedding(w, tokens));
  for (int64_t g = 0; g < w.num_groups(); ++g) {
    executor::KvCache cache;  // the prefill's KV cache (dropped at once here)
    SLICESCHED_ASSIGN_OR_RETURN(x, executor::FusedLayers(w, g, x, &cache, 0));
  }
  SLICESCHED_ASSIGN_OR_RETURN(Tensor logits, executor::LmHead(w, x));
  SLICESCHED_ASSIGN_OR_RETURN(Tensor t, executor::Sample(logits, executor::SamplingParams{}));
  const std::vector<int64_t> v = t.ToInt64();
  if (v.size() != 1) return absl::InternalError("direct prefill: no token sampled");
  return v[0];
}

// (b) The master's path: GMG + SliceScheduler + ExecutorSet on one device.
class ScheduledRig {
 public:
  static absl::StatusOr<std::unique_ptr<ScheduledRig>> Create(const LlamaDims& dims,
                                                              std::shared_ptr<const LlamaWeights> w) {
    std::vector<DeviceSpec> devs(1);
    devs[0].name = "cpu0";
    devs[0].type = "cpu";
    devs[0].memory = Bytes::GiB(4);
    devs[0].backend = DeviceBackend::kCpu;
    SLICESCHED_ASSIGN_OR_RETURN(AcceleratorSet accel,
                                AcceleratorSet::Create(devs, LinkSpec{10e9, Duration::Micros(5)}));
    SLICESCHED_ASSIGN_OR_RETURN(LlamaTemplates t, BuildLlamaTemplates(dims));
    SLICESCHED_ASSIGN_OR_RETURN(std::unique_ptr<LlamaKernelRunner> runner,
                                LlamaKernelRunner::Create(std::move(w), dims));
    auto rig = std::unique_ptr<ScheduledRig>(new ScheduledRig(std::move(accel), std::move(runner)));
    SLICESCHED_ASSIGN_OR_RETURN(rig->prefill_, rig->g_.RegisterTemplate(t.prefill));
    for (const OpSpec& op : t.prefill->ops()) {
      if (op.weight_key.empty()) continue;
      SLICESCHED_RETURN_IF_ERROR(rig->g_.LoadWeights(DeviceId(0), op.weight_key, op.weight_bytes));
    }
    rig->Start();
    return rig;
  }

  // One prefill of `tokens` [1, S], start to retirement; returns its token.
  absl::StatusOr<int64_t> Prefill(const Tensor& tokens, int64_t s) {
    spec_.bindings = {{"B", 1}, {"S", s}};
    spec_.arrival = clock_.Now();
    SLICESCHED_ASSIGN_OR_RETURN(InstanceId id, g_.Instantiate(spec_));
    runner_->SetRequest(id, LlamaRequest{tokens, executor::SamplingParams{}});
    SLICESCHED_ASSIGN_OR_RETURN(ScheduleStats st, sched_.Schedule(env_, clock_.Now()));
    whatif_runs_ += st.whatif_runs;
    for (;;) {
      for (const RetiredInstance& r : g_.TakeRetired()) {
        if (r.id != id) continue;
        runner_->EraseRequest(id);
        for (CheckpointId k : r.produced) SLICESCHED_RETURN_IF_ERROR(g_.ReleaseCheckpoint(k));
        if (r.state != InstanceState::kDone) {
          return absl::InternalError(StrCat("scheduled prefill ", id, " ", InstanceStateName(r.state),
                                            ": ", r.failure));
        }
        return last_token_.load();
      }
      if (!g_.unscheduled_frontier().empty()) {
        SLICESCHED_ASSIGN_OR_RETURN(ScheduleStats more, sched_.Schedule(env_, clock_.Now()));
        whatif_runs_ += more.whatif_runs;
      }
      if (!exec_->WaitForCompletion(absl::Seconds(60))) {
        return absl::DeadlineExceededError("scheduled prefill: no completion within 60 s");
      }
      feedback_.clear();
      SLICESCHED_RETURN_IF_ERROR(exec_->AdvanceTo(clock_.Now(), &feedback_));
    }
  }

  // Lets the executors release what the GMG freed (released checkpoints).
  absl::Status Settle() {
    SLICESCHED_RETURN_IF_ERROR(exec_->Dispatch(clock_.Now()));
    return g_.VerifyInvariants();
  }
  int64_t whatif_runs() const { return whatif_runs_; }

 private:
  ScheduledRig(AcceleratorSet accel, std::unique_ptr<LlamaKernelRunner> runner)
      : g_(std::move(accel)),
        runner_(std::move(runner)),
        transfer_est_(g_.accelerators()),
        ctx_(&g_.templates(), &op_est_, &transfer_est_) {}

  void Start() {
    runner_->SetTokenSink([this](InstanceId, const Tensor& t) {
      const std::vector<int64_t> v = t.ToInt64();
      last_token_.store(v.empty() ? -1 : v[0]);
    });
    exec_ = std::make_unique<ExecutorSet>(&g_, &clock_, runner_.get(), &transfers_);
    env_.gmg = &g_;
    env_.backend = exec_.get();
    env_.sim = &ctx_;
    env_.pool = nullptr;
    spec_.template_id = prefill_;
    spec_.priority_class = PriorityClass::kOnline;
  }

  SteadyClock clock_;
  GlobalMappingGraph g_;
  std::unique_ptr<LlamaKernelRunner> runner_;
  executor::LlamaTransferBackend transfers_;
  OpEstimator op_est_;
  TransferEstimator transfer_est_;
  SimContext ctx_;
  SliceScheduler sched_;
  SchedulerEnv env_;
  TemplateId prefill_;
  InstanceSpec spec_;
  std::vector<Feedback> feedback_;
  std::atomic<int64_t> last_token_{-1};
  int64_t whatif_runs_ = 0;
  std::unique_ptr<ExecutorSet> exec_;  // last: stopped first
};

}  // namespace

absl::StatusOr<OverheadResult> RunOverhead(const OverheadOptions& o) {
  if (o.prefills <= 0) return absl::InvalidArgumentError("overhead: --prefills must be positive");
  if (o.repetitions <= 0) return absl::InvalidArgumentError("overhead: --repetitions must be positive");
  SLICESCHED_ASSIGN_OR_RETURN(LlamaDims dims, LlamaPreset(o.model));
  // The direct path gets the same single core as an executor's device thread.
  executor::SetIntraOpThreadsForThisThread(1);
  SLICESCHED_ASSIGN_OR_RETURN(std::shared_ptr<const LlamaWeights> w,
                              LlamaWeights::FromSeed(dims, o.seed));
  SLICESCHED_ASSIGN_OR_RETURN(std::unique_ptr<ScheduledRig> rig, ScheduledRig::Create(dims, w));

  // Context length 1: one prompt token per prefill, built up front.
  std::vector<Tensor> prompts;
  prompts.reserve(static_cast<size_t>(o.prefills));
  for (int64_t i = 0; i < o.prefills; ++i) {
    const std::vector<int64_t> tok = {(i * 7919 + 13) % dims.vocab};
    prompts.push_back(Tensor::FromInt64(tok, {1, 1}));
  }
  std::vector<int64_t> direct_tokens(prompts.size()), sched_tokens(prompts.size());

  for (int i = 0; i < o.warmup; ++i) {
    const Tensor& p = prompts[static_cast<size_t>(i) % prompts.size()];
    SLICESCHED_RETURN_IF_ERROR(DirectPrefill(*w, p).status());
    SLICESCHED_RETURN_IF_ERROR(rig->Prefill(p, 1).status());
  }
  SLICESCHED_RETURN_IF_ERROR(rig->Settle());

  OverheadResult r;
  r.prefills = o.prefills;
  r.model = o.model;
  r.repetitions = o.repetitions;
  r.tokens_match = true;
  for (int rep = 0; rep < o.repetitions; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < prompts.size(); ++i) {
      SLICESCHED_ASSIGN_OR_RETURN(direct_tokens[i], DirectPrefill(*w, prompts[i]));
    }
    r.direct_runs_s.push_back(Seconds(std::chrono::steady_clock::now() - t0));
    t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < prompts.size(); ++i) {
      SLICESCHED_ASSIGN_OR_RETURN(sched_tokens[i], rig->Prefill(prompts[i], 1));
    }
    r.scheduled_runs_s.push_back(Seconds(std::chrono::steady_clock::now() - t0));
    SLICESCHED_RETURN_IF_ERROR(rig->Settle());
    r.tokens_match = r.tokens_match && direct_tokens == sched_tokens;
  }
  r.direct_s = Median(r.direct_runs_s);
  r.scheduled_s = Median(r.scheduled_runs_s);
  r.overhead_pct = r.direct_s > 0 ? 100.0 * (r.scheduled_s - r.direct_s) / r.direct_s : 0.0;
  r.placement = rig->whatif_runs() == 0
                    ? "SliceScheduler, 1 CPU device: one candidate (partition single), no what-if runs"
                    : StrCat("SliceScheduler, 1 CPU device, ", rig->whatif_runs(), " what-if runs");
  if (!r.tokens_match) {
    return absl::InternalError("overhead: the scheduled prefills sampled other tokens than the direct ones");
  }
  return r;
}

}  // namespace slicesched
