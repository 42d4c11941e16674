#include "slicesched/experiments/replay.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>
#include <utility>

#include "absl/strings/str_format.h"
#include "replay_internal.h"
#include "slicesched/common/option_checks.h"
#include "slicesched/common/stats.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/common/thread_pool.h"

namespace slicesched {

std::vector<std::string> ReplayPolicyNames() {
  return {"Static-Online", "Full-Share", "Subset-Share", "Dual-Share", "Priority-Colocate", "SliceScheduler"};
}

namespace replay_internal {

absl::StatusOr<BaseWorkload> LoadBaseWorkload(const std::string& trace, uint64_t seed) {
  BaseWorkload w;
  if (trace.empty()) {
    w.requests = GenerateBuiltInWorkload(BuiltInWorkloadModel{}, 3436.0, seed);
    w.name = "built-in (derived from the Azure code trace)";
  } else {
    SLICESCHED_ASSIGN_OR_RETURN(w.requests, LoadAzureLlmTrace(trace));
    w.name = trace;
  }
  if (w.requests.empty()) return absl::InvalidArgumentError(StrCat("trace ", w.name, " has no requests"));
  return w;
}

std::vector<TaggedRequest> OnlineWorkload(const std::vector<Request>& base, double load_scale, double minutes,
                                          uint64_t seed) {
  std::vector<TaggedRequest> online;
  for (int k = 0; k < 4; ++k) {
    // Load scale < 1 thins the requests (the timeline stays); > 1 compresses time.
    std::vector<Request> shifted = CyclicShift(base, k / 4.0);
    shifted = load_scale <= 1.0 ? Thin(shifted, load_scale, seed * 4 + static_cast<uint64_t>(k))
                                : ScaleLoad(shifted, load_scale);
    for (const Request& r : Window(shifted, 0, minutes * 60.0)) {
      online.push_back({r.arrival_s, r.context_tokens, r.generated_tokens, k});
    }
  }
  std::stable_sort(online.begin(), online.end(),
                   [](const TaggedRequest& a, const TaggedRequest& b) { return a.arrival_s < b.arrival_s; });
  return online;
}

absl::StatusOr<RunOutput> RunReference(const std::vector<Request>& base, double load_scale, RunSettings s) {
  s.offline_rate = 0;
  return RunPolicy("Static-Online", OnlineWorkload(base, load_scale, s.minutes, s.seed), s);
}

double SloMs(const RunOutput& reference) { return Quantile(reference.ttft_ms, 0.9); }

absl::StatusOr<double> FitLoadScale(const std::vector<Request>& base, double target, const RunSettings& s,
                                    RunOutput* reference, int* runs) {
  // Utilisation grows with the scale (thinning keeps a superset of the
  // requests as the scale rises) and roughly in proportion to it, so a step
  // through the origin lands close; the bracket keeps the search safe where
  // queueing makes it bend.
  constexpr double kMinScale = 1e-4, kMaxScale = 64;
  constexpr int kMaxRuns = 24;
  double lo = 0, hi = kMaxScale, lo_util = 0, hi_util = 1;
  double scale = 0.1;
  RunSettings quiet = s;
  quiet.progress = false;
  for (*runs = 1; *runs <= kMaxRuns; ++*runs) {
    SLICESCHED_ASSIGN_OR_RETURN(*reference, RunReference(base, scale, quiet));
    const double util = reference->result.gpu_util;
    if (std::abs(util - target) <= kTargetUtilTolerance) return scale;
    if (util < target) {
      lo = scale;
      lo_util = util;
    } else {
      hi = scale;
      hi_util = util;
    }
    // Secant between the bracket ends (through the origin while lo is 0),
    // kept strictly inside the bracket; the midpoint otherwise.
    double next = lo + (target - lo_util) * (hi - lo) / std::max(1e-9, hi_util - lo_util);
    if (hi == kMaxScale) next = util > 0 ? scale * target / util : scale * 4;
    if (!(next > lo && next < hi) || std::abs(next - scale) < 1e-9) next = 0.5 * (lo + hi);
    if (next < kMinScale) break;
    scale = next;
  }
  return absl::FailedPreconditionError(
      absl::StrFormat("--target-util %.3f: no load scale in [%g, %g] gives Static-Online that utilisation within "
                      "%.2f (last: scale %.4f, utilisation %.3f); pass --load-scale instead",
                      target, kMinScale, kMaxScale, kTargetUtilTolerance, scale, reference->result.gpu_util));
}

}  // namespace replay_internal

namespace {

using replay_internal::RunOutput;
using replay_internal::RunSettings;

absl::Status WriteSummary(const std::string& dir, const ReplayResult& r) {
  std::ofstream f(dir + "/summary.csv");
  if (!f) return absl::InvalidArgumentError(StrCat("cannot write ", dir, "/summary.csv"));
  f << "policy,req_per_s,tok_per_s,slo_attainment,gpu_util,ttft_p50_ms,ttft_p99_ms,online_req_per_s,"
       "offline_tok_per_s,offline_offered_per_s,offline_completed_frac,tbt_p50_ms,tbt_p99_ms,harvest,load_scale,"
       "offline_latency_p50_s,offline_latency_p90_s\n";
  for (const PolicyResult& p : r.policies) {
    f << absl::StrFormat("%s,%.4f,%.4f,%.4f,%.4f,%.1f,%.1f,%.4f,%.4f,%.4f,%.4f,%.1f,%.1f,%.4f,%.6f,%.2f,%.2f\n", p.policy,
                         p.req_per_s, p.tok_per_s, p.slo_attainment, p.gpu_util, p.ttft_p50_ms, p.ttft_p99_ms,
                         p.online_req_per_s, p.offline_tok_per_s, p.offline_offered_per_s, p.offline_completed_frac,
                         p.tbt_p50_ms, p.tbt_p99_ms, p.harvest, r.load_scale, p.offline_latency_p50_s,
                         p.offline_latency_p90_s);
  }
  return f ? absl::OkStatus() : absl::InternalError("writing summary.csv failed");
}

}  // namespace

absl::Status ReplayOptions::Validate() const {
  if (!(minutes > 0) || !std::isfinite(minutes)) return OptionOutOfRange("--minutes", "> 0", minutes);
  if (!(target_util > 0 && target_util < 1)) return OptionOutOfRange("--target-util", "in (0, 1)", target_util);
  if (!(load_scale >= 0) || !std::isfinite(load_scale)) return OptionOutOfRange("--load-scale", ">= 0", load_scale);
  if (!(offline_rate >= 0) || !std::isfinite(offline_rate) || offline_rate > 1000) {
    return OptionOutOfRange("--offline-rate", "in 0..1000", offline_rate);
  }
  if (threads < 0 || threads > 1024) return OptionOutOfRange("--threads", "in 0..1024", threads);
  if (policy != "all" && replay_internal::MakePolicy(policy) == nullptr) {
    return OptionOutOfRange(
        "--policy", "Static-Online, Full-Share, Subset-Share, Dual-Share, Priority-Colocate, SliceScheduler or all",
        policy);
  }
  return absl::OkStatus();
}

absl::StatusOr<ReplayResult> RunReplay(const ReplayOptions& o) {
  SLICESCHED_RETURN_IF_ERROR(o.Validate());
  const std::vector<std::string> names = o.policy == "all" ? ReplayPolicyNames() : std::vector<std::string>{o.policy};
  ReplayResult result;
  SLICESCHED_ASSIGN_OR_RETURN(replay_internal::BaseWorkload base, replay_internal::LoadBaseWorkload(o.trace, o.seed));
  result.workload = base.name;
  const RunSettings settings{.minutes = o.minutes, .seed = o.seed, .offline_rate = o.offline_rate,
                             .threads = o.threads, .progress = o.progress};

  // Static-Online first: it fixes the regime, the SLO and the idle time.
  RunOutput reference;
  if (o.load_scale > 0) {
    result.load_scale = o.load_scale;
    SLICESCHED_ASSIGN_OR_RETURN(reference, replay_internal::RunReference(base.requests, o.load_scale, settings));
    result.fit_runs = 0;
  } else {
    SLICESCHED_ASSIGN_OR_RETURN(result.load_scale, replay_internal::FitLoadScale(base.requests, o.target_util,
                                                                                 settings, &reference,
                                                                                 &result.fit_runs));
    result.load_scale_fitted = true;
  }
  const std::vector<replay_internal::TaggedRequest> online =
      replay_internal::OnlineWorkload(base.requests, result.load_scale, o.minutes, o.seed);
  result.slo_ttft_ms = replay_internal::SloMs(reference);
  const int64_t end_ns = static_cast<int64_t>(o.minutes * 60e9);
  const std::vector<IdleSlice> slices = IdleSlices(reference.busy, 0, end_ns);
  result.idle = SummarizeIdleSlices(slices, o.minutes * 60.0, static_cast<int>(reference.busy.size()));
  std::vector<std::vector<BusyInterval>> per_instance(reference.busy.size() / 2);
  for (size_t d = 0; d < reference.busy.size(); ++d) {
    auto& dst = per_instance[d / 2];
    dst.insert(dst.end(), reference.busy[d].begin(), reference.busy[d].end());
  }
  result.overlap = ComputeIdleOverlap(per_instance, 0, end_ns);

  // The other policies are independent runs: side by side, one per core.
  // Each is deterministic on its own, so the results do not depend on how
  // many run at once.
  std::vector<absl::StatusOr<RunOutput>> runs(names.size(), absl::UnknownError("not run"));
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  RunSettings side_by_side = settings;
  side_by_side.progress = settings.progress && (cores == 1 || names.size() <= 2);
  {
    ThreadPool pool(cores);
    pool.ParallelFor(names.size(), [&](size_t i) {
      if (names[i] == "Static-Online") {
        runs[i] = reference;
        runs[i]->result.offline_offered_per_s = o.offline_rate;
      } else {
        runs[i] = replay_internal::RunPolicy(names[i], online, side_by_side);
      }
    });
  }
  for (absl::StatusOr<RunOutput>& run : runs) {
    SLICESCHED_RETURN_IF_ERROR(run.status());
    replay_internal::JudgeAgainstReference(result.slo_ttft_ms, result.idle.total_idle_s, &*run);
    result.policies.push_back(run->result);
  }

  if (!o.out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.out_dir, ec);
    if (ec) return absl::InvalidArgumentError(StrCat("cannot create ", o.out_dir, ": ", ec.message()));
    SLICESCHED_RETURN_IF_ERROR(WriteSummary(o.out_dir, result));
    SLICESCHED_RETURN_IF_ERROR(WriteIdleSlicesCsv(o.out_dir + "/idle_slices.csv", slices));
    SLICESCHED_RETURN_IF_ERROR(WriteIdleOverlapCsv(o.out_dir + "/idle_overlap.csv", result.overlap));
  }
  return result;
}

}  // namespace slicesched
