// The capacity sweep: online utilisation x offline load, per policy.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "replay_internal.h"
#include "slicesched/common/option_checks.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/common/thread_pool.h"

namespace slicesched {
namespace {

using replay_internal::RunOutput;
using replay_internal::RunSettings;
using replay_internal::TaggedRequest;

// One target utilisation: its workload and Static-Online's judgement.
struct Level {
  double util = 0, scale = 0, slo_ms = 0, idle_s = 0;
  std::vector<TaggedRequest> online;
  PolicyResult reference;
};

// A bar on stderr counting finished runs (when stderr is a terminal).
class SweepProgress {
 public:
  SweepProgress(bool on, int total) : on_(on && isatty(2)), total_(total) {}
  void Tick() {
    const int done = ++done_;
    if (!on_) return;
    absl::MutexLock lock(&mu_);
    const int bar = done * 30 / std::max(total_, done);
    std::fprintf(stderr, "\rsweep [%.*s%.*s] %d/~%d runs", bar, "##############################", 30 - bar,
                 "..............................", done, total_);
    std::fflush(stderr);
  }
  void Done() {
    if (on_) std::fprintf(stderr, "\n");
  }

 private:
  bool on_;
  int total_;
  std::atomic<int> done_{0};
  absl::Mutex mu_;
};

absl::Status WriteSweepCsv(const std::string& path, const std::vector<SweepPoint>& points) {
  std::ofstream f(path);
  if (!f) return absl::InvalidArgumentError(StrCat("cannot write ", path));
  f << "util,load_scale,policy,max_sustained_offline_rate,harvest_at_saturation,tok_per_s_at_saturation,"
       "slo_at_saturation,offline_completed_frac_at_saturation,tbt_p99_ms_at_saturation,gpu_util_at_saturation,"
       "offline_settled_frac_at_saturation\n";
  for (const SweepPoint& p : points) {
    const PolicyResult& s = p.saturated;
    f << absl::StrFormat("%.3f,%.6f,%s,%.3f,%.4f,%.4f,%.4f,%.4f,%.1f,%.4f,%.4f\n", p.util, p.load_scale, p.policy,
                         p.max_sustained_rate, s.harvest, s.tok_per_s, s.slo_attainment, s.offline_completed_frac,
                         s.tbt_p99_ms, s.gpu_util, s.offline_settled_frac);
  }
  return f ? absl::OkStatus() : absl::InternalError(StrCat("writing ", path, " failed"));
}

}  // namespace

absl::Status SweepOptions::Validate() const {
  if (!(minutes > 0) || !std::isfinite(minutes)) return OptionOutOfRange("--minutes", "> 0", minutes);
  if (utils.empty() || rates.empty()) return absl::InvalidArgumentError("the sweep needs utilisations and rates");
  for (double u : utils) {
    if (!(u > 0 && u < 1)) return OptionOutOfRange("sweep utilisation", "in (0, 1)", u);
  }
  for (size_t i = 0; i < rates.size(); ++i) {
    if (!(rates[i] > 0) || (i > 0 && rates[i] <= rates[i - 1])) {
      return absl::InvalidArgumentError("sweep offline rates must be positive and increasing");
    }
  }
  if (!(saturating_rate > rates.back())) return OptionOutOfRange("saturating rate", "above every sweep rate", saturating_rate);
  if (jobs < 0 || jobs > 1024) return OptionOutOfRange("--jobs", "in 0..1024", jobs);
  if (out_dir.empty()) return absl::InvalidArgumentError("--sweep needs --out DIR");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SweepPoint>> RunReplaySweep(const SweepOptions& o) {
  SLICESCHED_RETURN_IF_ERROR(o.Validate());
  SLICESCHED_ASSIGN_OR_RETURN(replay_internal::BaseWorkload base, replay_internal::LoadBaseWorkload(o.trace, o.seed));
  const std::vector<std::string> all = ReplayPolicyNames();
  const std::vector<std::string> sharing(all.begin() + 1, all.end());
  const int jobs = o.jobs > 0 ? o.jobs : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  // Each run simulates serially; the parallelism is across runs.
  const RunSettings settings{.minutes = o.minutes, .seed = o.seed, .offline_rate = 0, .threads = 1, .progress = false};
  SweepProgress progress(o.progress,
                         static_cast<int>(o.utils.size() * (2 + sharing.size() * (o.rates.size() / 2 + 2))));
  ThreadPool pool(jobs);

  // Fit each level's load scale (Static-Online without offline work).
  std::vector<Level> levels(o.utils.size());
  std::vector<absl::Status> errors(o.utils.size());
  pool.ParallelFor(levels.size(), [&](size_t i) {
    Level& l = levels[i];
    l.util = o.utils[i];
    RunOutput ref;
    int runs = 0;
    absl::StatusOr<double> scale = replay_internal::FitLoadScale(base.requests, l.util, settings, &ref, &runs);
    progress.Tick();
    if (!scale.ok()) {
      errors[i] = scale.status();
      return;
    }
    l.scale = *scale;
    l.online = replay_internal::OnlineWorkload(base.requests, l.scale, o.minutes, o.seed);
    l.slo_ms = replay_internal::SloMs(ref);
    l.idle_s = SummarizeIdleSlices(IdleSlices(ref.busy, 0, static_cast<int64_t>(o.minutes * 60e9)), o.minutes * 60.0,
                                   static_cast<int>(ref.busy.size()))
                   .total_idle_s;
    replay_internal::JudgeAgainstReference(l.slo_ms, l.idle_s, &ref);
    l.reference = ref.result;
  });
  for (const absl::Status& e : errors) SLICESCHED_RETURN_IF_ERROR(e);

  // Per (level, policy): raise the offline rate until it is not sustained,
  // then one run at saturating load.
  std::vector<SweepPoint> points(levels.size() * sharing.size());
  std::vector<absl::Status> failures(points.size());
  pool.ParallelFor(points.size(), [&](size_t k) {
    const Level& l = levels[k / sharing.size()];
    SweepPoint& p = points[k];
    p.util = l.util;
    p.load_scale = l.scale;
    p.policy = sharing[k % sharing.size()];
    auto run_at = [&](double rate) -> absl::StatusOr<PolicyResult> {
      RunSettings s = settings;
      s.offline_rate = rate;
      SLICESCHED_ASSIGN_OR_RETURN(RunOutput out, replay_internal::RunPolicy(p.policy, l.online, s));
      progress.Tick();
      replay_internal::JudgeAgainstReference(l.slo_ms, l.idle_s, &out);
      return out.result;
    };
    for (double rate : o.rates) {
      absl::StatusOr<PolicyResult> r = run_at(rate);
      if (!r.ok()) {
        failures[k] = r.status();
        return;
      }
      if (r->slo_attainment < o.min_slo || r->offline_settled_frac < o.min_completed) break;
      p.max_sustained_rate = rate;
    }
    absl::StatusOr<PolicyResult> saturated = run_at(o.saturating_rate);
    if (!saturated.ok()) {
      failures[k] = saturated.status();
      return;
    }
    p.saturated = *saturated;
  });
  progress.Done();
  for (const absl::Status& e : failures) SLICESCHED_RETURN_IF_ERROR(e);

  // Static-Online first at each level: no offline work, harvest 0.
  std::vector<SweepPoint> out;
  for (size_t i = 0; i < levels.size(); ++i) {
    SweepPoint so{.util = levels[i].util, .load_scale = levels[i].scale, .policy = all[0]};
    so.saturated = levels[i].reference;
    out.push_back(so);
    for (size_t j = 0; j < sharing.size(); ++j) out.push_back(points[i * sharing.size() + j]);
  }
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) return absl::InvalidArgumentError(StrCat("cannot create ", o.out_dir, ": ", ec.message()));
  SLICESCHED_RETURN_IF_ERROR(WriteSweepCsv(o.out_dir + "/sweep.csv", out));
  return out;
}

}  // namespace slicesched
