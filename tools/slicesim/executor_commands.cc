// slicesim's commands: Experiments on the LibTorch executors: overhead (Table 1), generate-direct,
// fidelity (Table 2), and torch-info. Linked only into a build with LibTorch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "command.h"
#include "slicesched/executor/kernels/llama_serving.h"
#include "slicesched/executor/torch/tensor.h"
#include "slicesched/experiments/fidelity.h"
#include "slicesched/experiments/overhead.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/jobs/batch_input.h"

namespace slicesim {
namespace {

int Overhead(const std::vector<std::string>& args) {
  slicesched::OverheadOptions o;
  bool json = false;
  bool pin = false, no_pin = false, direct_on_main = o.direct_on_main;
  std::string direct_allocator = o.direct_cache ? "cache" : "default";
  if (int rc = Flags("overhead")
                   .Switch("--json", &json)
                   .Choice("--model", {"tiny", "small", "llama3-8b"}, &o.model)
                   .Choice("--device", {"cpu", "cuda"}, &o.device)
                   .Int("--prefills", &o.prefills)
                   .Int("--repetitions", &o.repetitions)
                   .Int("--window", &o.window)
                   .Int("--block", &o.block)
                   .Switch("--pin", &pin)
                   .Switch("--no-pin", &no_pin)
                   .Switch("--direct-on-main", &direct_on_main)
                   .Choice("--direct-allocator", {"cache", "default"}, &direct_allocator)
                   .Choice("--only", {"direct", "scheduled"}, &o.only)
                   .Switch("--null", &o.null_check)
                   .Int("--nap-us", &o.nap_us)
                   .Int("--tail-spin-us", &o.tail_spin_us)
                   .Int("--wake-batch", &o.wake_batch)
                   .Choice("--priorities", {"fcfs", "equal"}, &o.priorities)
                   .Choice("--order", {"abba", "direct-first"}, &o.order)
                   .Seed("--seed", &o.seed)
                   .Parse(args)) {
    return rc;
  }
  // Not given: the default batch, but never more than the window (so that
  // `--window 1` alone still means one prefill at a time).
  const bool wake_given = std::any_of(args.begin(), args.end(), [](const std::string& a) {
    return a == "--wake-batch" || a.rfind("--wake-batch=", 0) == 0;
  });
  if (!wake_given) o.wake_batch = std::clamp(o.wake_batch, 1, std::max(o.window, 1));
  if (pin && no_pin) {
    return Rejected("overhead", absl::InvalidArgumentError("--pin and --no-pin contradict each other; give one"));
  }
  if (pin || no_pin) o.pin = pin;  // neither: the default (pinned)
  o.direct_on_main = direct_on_main;
  o.direct_cache = direct_allocator == "cache";
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("overhead", v);
  auto r = slicesched::RunOverhead(o);
  if (!r.ok()) return Failed("overhead", r.status());
  if (json) {
    std::printf("%s\n", r->ToJson().c_str());
  } else {
    if (r->null_check) {
      std::printf("null check: \"scheduled\" below is the direct loop on a twin thread (an A/A comparison: "
                  "what a scheduler costing nothing would get on this machine)\n");
    }
    std::printf("%lld prefills (context 1), median of %d alternations, %s\n"
                "direct %.3f s, scheduled %.3f s: overhead %.2f%%\n"
                "block by block (%zu pairs of %lld prefills): median %.2f%%, quartiles %.2f%% .. %.2f%%; "
                "%.2f us an operator (%d a prefill, %.1f us each directly)\n%s\n%s\n",
                static_cast<long long>(r->prefills), r->repetitions,
                r->null_check ? "no scheduler" : absl::StrCat(r->window, " in flight").c_str(), r->direct_s,
                r->scheduled_s,
                r->overhead_pct, r->block_ratios.size(), static_cast<long long>(r->block), r->paired_overhead_pct,
                r->paired_q1_pct, r->paired_q3_pct, r->paired_overhead_us_per_op, r->ops_per_prefill,
                r->per_op_direct_us(), r->placement.c_str(), r->pinning.c_str());
  }
  return 0;
}

// generate-direct --batch FILE: every request of an OpenAI Batch input file
// (any body.model), with the seed the batch runner gives it, one JSON line
// each: what a batch run must answer.
int GenerateDirectBatch(const slicesched::executor::LlamaWeights& weights, int64_t vocab, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "slicesim generate-direct: --batch: cannot read '%s'\n", path.c_str());
    return kExitUsage;
  }
  std::ostringstream text;
  text << in.rdbuf();
  auto any_model = [vocab](std::string_view) {
    return std::optional<slicesched::BatchModelInfo>(
        slicesched::BatchModelInfo{.vocab = vocab, .max_context_tokens = int64_t{1} << 30});
  };
  auto batch = slicesched::ParseBatchInput(text.str(), any_model, /*strict=*/true);
  if (!batch.ok()) return Rejected("generate-direct", batch.status());
  for (const slicesched::BatchRequest& r : batch->requests) {
    slicesched::executor::SamplingParams sp{
        .temperature = r.temperature, .top_p = r.top_p, .seed = slicesched::BatchRequestSeed(r)};
    auto tokens = slicesched::executor::GenerateDirect(weights, r.prompt_tokens, static_cast<int>(r.max_tokens), sp,
                                                       r.stop_tokens);
    if (!tokens.ok()) return Failed("generate-direct", tokens.status());
    std::printf("{\"custom_id\": \"%s\", \"tokens\": [%s]}\n", r.custom_id.c_str(),
                absl::StrJoin(*tokens, ", ").c_str());
  }
  return 0;
}

int GenerateDirectCommand(const std::vector<std::string>& args) {
  std::string model = "tiny", safetensors, prompt_text, stop_text, batch_path;
  uint64_t weights_seed = 1, seed = 0;
  int max_tokens = 0;
  int64_t top_k = 0;
  double temperature = 0, top_p = 1;
  if (int rc = Flags("generate-direct")
                   .Choice("--model", {"tiny", "small", "llama3-8b"}, &model)
                   .Seed("--weights-seed", &weights_seed)
                   .Text("--safetensors", &safetensors)
                   .Text("--prompt", &prompt_text)
                   .Int("--max-tokens", &max_tokens)
                   .Text("--batch", &batch_path)
                   .Num("--temperature", &temperature)
                   .Num("--top-p", &top_p)
                   .Int("--top-k", &top_k)
                   .Seed("--seed", &seed)
                   .Text("--stop", &stop_text)
                   .Parse(args)) {
    return rc;
  }
  auto ids = [](const std::string& text, const char* flag, std::vector<int64_t>* out) {
    for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
      int64_t v = 0;
      if (!absl::SimpleAtoi(part, &v)) {
        std::fprintf(stderr, "slicesim generate-direct: %s: '%s' is not a token id\n", flag, std::string(part).c_str());
        return false;
      }
      out->push_back(v);
    }
    return true;
  };
  if (batch_path.empty() && prompt_text.empty()) {
    std::fprintf(stderr, "slicesim generate-direct: --prompt is required (or --batch FILE)\n");
    return kExitUsage;
  }
  if (!batch_path.empty()) {
    auto dims = slicesched::LlamaPreset(model);
    if (!dims.ok()) return Failed("generate-direct", dims.status());
    auto weights = safetensors.empty() ? slicesched::executor::LlamaWeights::FromSeed(*dims, weights_seed)
                                       : slicesched::executor::LlamaWeights::FromSafetensors(*dims, safetensors);
    if (!weights.ok()) return Failed("generate-direct", weights.status());
    return GenerateDirectBatch(**weights, dims->vocab, batch_path);
  }
  std::vector<int64_t> prompt, stop;
  if (!ids(prompt_text, "--prompt", &prompt) || !ids(stop_text, "--stop", &stop)) return kExitUsage;
  slicesched::executor::SamplingParams sp{.temperature = temperature, .top_p = top_p, .seed = seed, .top_k = top_k};
  if (absl::Status v = slicesched::executor::CheckGenerateDirect(prompt, max_tokens, sp); !v.ok()) {
    return Rejected("generate-direct", v);
  }
  auto dims = slicesched::LlamaPreset(model);
  if (!dims.ok()) return Failed("generate-direct", dims.status());
  auto weights = safetensors.empty()
                     ? slicesched::executor::LlamaWeights::FromSeed(*dims, weights_seed)
                     : slicesched::executor::LlamaWeights::FromSafetensors(*dims, safetensors);
  if (!weights.ok()) return Failed("generate-direct", weights.status());
  auto tokens = slicesched::executor::GenerateDirect(**weights, prompt, max_tokens, sp, stop);
  if (!tokens.ok()) return Failed("generate-direct", tokens.status());
  std::printf("{\"tokens\": [%s]}\n", absl::StrJoin(*tokens, ", ").c_str());
  return 0;
}

int Fidelity(const std::vector<std::string>& args) {
  slicesched::FidelityOptions o;
  bool json = false;
  bool per_op = false;
  if (int rc = Flags("fidelity")
                   .Switch("--json", &json)
                   .Switch("--per-op", &per_op)
                   .Int("--warmup", &o.warmup)
                   .Choice("--model", {"tiny", "small"}, &o.model)
                   .Choice("--device", {"cpu", "cuda"}, &o.device)
                   .Int("--calibration", &o.calibration)
                   .Int("--iterations", &o.iterations)
                   .Seed("--seed", &o.seed)
                   .Int("--train-batch", &o.train_batch)
                   .Int("--train-tokens", &o.train_tokens)
                   .Int("--prompt-tokens", &o.prompt_tokens)
                   .Int("--decode-steps", &o.decode_steps)
                   .Num("--drift-smoothing", &o.drift_smoothing)
                   .Parse(args)) {
    return rc;
  }
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("fidelity", v);
  auto r = slicesched::RunFidelity(o);
  if (!r.ok()) return Failed("fidelity", r.status());
  if (json) {
    std::printf("%s\n", r->ToJson().c_str());
  } else {
    std::printf("%s, %s, %d warm-up and %d calibration iterations of each kind\n", r->model.c_str(),
                r->placement.c_str(), r->warmup, r->calibration);
    for (const auto& [name, k] : {std::pair<const char*, const slicesched::FidelityKindResult*>{"train", &r->train},
                                  {"serve", &r->serve},
                                  {"overall", &r->overall}}) {
      std::printf("%-8s %3lld iterations: predicted %.3f ms, measured %.3f ms, error %.2f%% "
                  "(mean per-iteration %.2f%%); per transfer: launch gap %.3f ms, delivery gap %.3f ms\n",
                  name, static_cast<long long>(k->iterations), k->predicted_ms, k->measured_ms, k->error_pct,
                  k->mean_abs_error_pct, k->launch_gap_ms, k->delivery_gap_ms);
    }
    std::printf("learned hand-off per hop: cpu0 -> cpu1 %.3f ms, cpu1 -> cpu0 %.3f ms\n"
                "estimator online MAPE: operators %.2f%%, transfers %.2f%%; target %.2f%%: %s\n",
                r->learned_handoff_01_ms, r->learned_handoff_10_ms, r->op_mape_pct, r->transfer_mape_pct,
                r->target_error_pct,
                r->overall.error_pct <= r->target_error_pct ? "met" : "NOT met");
    std::printf("simulator per-operator error weighted by duration: %.2f%%\n", r->op_wape_pct);
    std::printf("calibration: device factors %.3f %.3f (drift %.3f), overlap %.3f, transfer overlap %.3f\n",
                r->device_factors.size() > 0 ? r->device_factors[0] : 1.0,
                r->device_factors.size() > 1 ? r->device_factors[1] : 1.0, r->drift_factor, r->overlap_factor,
                r->transfer_overlap_factor);
    if (per_op) {
      std::printf("%-44s %3s %7s %12s %12s %8s\n", "operator or hop (scored)", "dev", "samples", "predicted ms",
                  "measured ms", "MAPE %");
      for (const slicesched::FidelityOpStat& s : r->ops) {
        std::printf("%-44s %3d %7lld %12.4f %12.4f %8.2f\n", s.name.c_str(), s.device,
                    static_cast<long long>(s.samples), s.predicted_ms, s.measured_ms, s.mape_pct);
      }
    }
  }
  return 0;
}

// What LibTorch this binary runs on, and the CUDA devices it sees: the first
// thing to ask on a new machine (tools/gpu-check runs it).
int TorchInfo(const std::vector<std::string>& args) {
  bool json = false;
  if (int rc = Flags("torch-info").Switch("--json", &json).Parse(args); rc != 0) return rc;
  const slicesched::executor::TorchRuntimeInfo info = slicesched::executor::QueryTorchRuntime();
  const std::string cuda =
      info.cuda_build > 0 ? absl::StrCat(info.cuda_build / 1000, ".", (info.cuda_build % 1000) / 10) : "";
  if (json) {
    std::printf("{\"torch\": \"%s\", \"cuda_build\": \"%s\", \"cuda_devices\": %d}\n", info.version.c_str(),
                cuda.c_str(), info.cuda_devices);
  } else {
    std::printf("LibTorch %s, %s, %d CUDA device%s visible\n", info.version.c_str(),
                cuda.empty() ? "a CPU build" : absl::StrCat("built for CUDA ", cuda).c_str(), info.cuda_devices,
                info.cuda_devices == 1 ? "" : "s");
  }
  return 0;
}

[[maybe_unused]] const bool kRegistered = RegisterCommands({
    {"overhead", &Overhead},
    {"generate-direct", &GenerateDirectCommand},
    {"fidelity", &Fidelity},
    {"torch-info", &TorchInfo},
});

}  // namespace
}  // namespace slicesim
