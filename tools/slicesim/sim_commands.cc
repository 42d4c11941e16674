// slicesim's commands: The simulator experiments: gmg, bench-sim, accuracy, replay.
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
#include "slicesched/experiments/accuracy.h"
#include "slicesched/experiments/bench_sim.h"
#include "slicesched/experiments/gmg_demo.h"
#include "slicesched/experiments/replay.h"
#include "slicesched/gmg/llama.h"

namespace slicesim {
namespace {

int Gmg(const std::vector<std::string>& args) {
  std::string config;
  if (int rc = Flags("gmg").Text("--config", &config).Parse(args)) return rc;
  auto c = slicesched::LoadGmgDemoConfig(config);
  if (!c.ok()) return Failed("gmg", c.status());
  auto report = slicesched::RunGmgDemo(*c);
  if (!report.ok()) return Failed("gmg", report.status());
  std::fputs(report->c_str(), stdout);
  return 0;
}

int BenchSim(const std::vector<std::string>& args) {
  slicesched::BenchSimOptions o;
  bool json = false;
  std::string sweep_dir;
  if (int rc = Flags("bench-sim")
                   .Switch("--json", &json)
                   .Text("--sweep", &sweep_dir)
                   .Int("--devices", &o.devices)
                   .Int("--ops", &o.ops)
                   .Int("--repetitions", &o.repetitions)
                   .Int("--warmup", &o.warmup)
                   .Seed("--seed", &o.seed)
                   .Int("--horizon-us", &o.horizon_us)
                   .Parse(args)) {
    return rc;
  }
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("bench-sim", v);
  if (!sweep_dir.empty()) {
    absl::Status st = slicesched::RunBenchSimSweep({8, 64, 512}, {1000, 2000, 5000, 10000, 20000, 50000},
                                                   o.repetitions, sweep_dir);
    if (!st.ok()) return Failed("bench-sim", st);
    std::printf("wrote %s/bench_sim.csv (plot: bench/plots/plot_bench_sim.py %s)\n", sweep_dir.c_str(),
                sweep_dir.c_str());
    return 0;
  }
  auto r = slicesched::RunBenchSim(o);
  if (!r.ok()) return Failed("bench-sim", r.status());
  if (json) {
    std::printf("%s\n", r->ToJson().c_str());
  } else {
    std::printf("devices %d, instances %lld, simulated %lld operators (%lld compute, %lld transfers)\n"
                "snapshot %.1f us, construction %.1f us, simulation %.1f us (median of %d, after %d untimed)\n"
                "%.0f simulated operators per ms, construction included (paper: 176.8)\n",
                r->devices, static_cast<long long>(r->instances), static_cast<long long>(r->ops),
                static_cast<long long>(r->compute_ops), static_cast<long long>(r->transfers), r->snapshot_us,
                r->construct_us, r->simulate_us, r->repetitions, r->warmup, r->ops_per_ms);
  }
  return 0;
}

int Accuracy(const std::vector<std::string>& args) {
  slicesched::AccuracyOptions o;
  bool json = false;
  if (int rc = Flags("accuracy")
                   .Switch("--json", &json)
                   .Text("--trace", &o.trace)
                   .Num("--minutes", &o.minutes)
                   .Num("--load-scale", &o.load_scale)
                   .Num("--warmup", &o.warmup_s)
                   .Num("--predict-every", &o.predict_every_s)
                   .Seed("--seed", &o.seed)
                   .Parse(args)) {
    return rc;
  }
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("accuracy", v);
  auto r = slicesched::RunAccuracy(o);
  if (!r.ok()) return Failed("accuracy", r.status());
  if (json) {
    std::printf("%s\n", r->ToJson().c_str());
  } else {
    std::printf("workload: %s\n%lld requests, %lld instances, %lld operators, %lld transfers over %.0f s\n"
                "completion MAPE %.2f%% (p90 %.2f%%) over %lld predictions (paper: 1.83%%)\n"
                "operator estimator MAPE %.2f%% (paper 0.32%%), transfer estimator MAPE %.2f%% (paper 0.92%%)\n",
                r->workload.c_str(), static_cast<long long>(r->requests), static_cast<long long>(r->instances),
                static_cast<long long>(r->ops), static_cast<long long>(r->transfers), r->simulated_s,
                r->completion_mape_pct, r->completion_p90_ape_pct, static_cast<long long>(r->predictions),
                r->op_mape_pct, r->transfer_mape_pct);
  }
  return 0;
}

// `replay --sweep`: the window per point is 5 minutes unless --minutes says.
int Sweep(const slicesched::ReplayOptions& r, double minutes, int jobs) {
  slicesched::SweepOptions o;
  o.trace = r.trace;
  o.seed = r.seed;
  o.minutes = minutes != -1 ? minutes : 5;
  o.out_dir = r.out_dir;
  o.progress = r.progress;
  o.jobs = jobs;
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("replay --sweep", v);
  auto points = slicesched::RunReplaySweep(o);
  if (!points.ok()) return Failed("replay --sweep", points.status());
  std::printf("capacity sweep, %.0f-minute windows, seed %llu: highest offline rate sustained with online SLO >= "
              "%.0f%% and >= %.0f%% of offline work done; harvest at %.1f req/s offline\n",
              o.minutes, static_cast<unsigned long long>(o.seed), 100 * o.min_slo, 100 * o.min_completed,
              o.saturating_rate);
  std::printf("%5s %8s %-17s %9s %8s %7s %6s\n", "util", "scale", "policy", "max req/s", "harvest", "tok/s", "SLO");
  for (const auto& p : *points) {
    std::printf("%5.2f %8.4f %-17s %9.2f %7.1f%% %7.2f %5.1f%%\n", p.util, p.load_scale, p.policy.c_str(),
                p.max_sustained_rate, 100 * p.saturated.harvest, p.saturated.tok_per_s,
                100 * p.saturated.slo_attainment);
  }
  const std::string script = std::string(SLICESCHED_SOURCE_DIR) + "/bench/plots/plot_sweep.py";
  const std::string cmd = "/usr/bin/python3 '" + script + "' '" + o.out_dir + "' > /dev/null";
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "slicesim replay --sweep: plots not drawn (needs /usr/bin/python3 with matplotlib); "
                 "sweep.csv is in %s\n", o.out_dir.c_str());
  } else {
    std::printf("wrote %s/sweep.csv, sweep_harvest.png and sweep_tok_per_s.png\n", o.out_dir.c_str());
  }
  return 0;
}

int Replay(const std::vector<std::string>& args) {
  slicesched::ReplayOptions o;
  bool no_progress = false, sweep = false;
  double minutes = -1;
  int jobs = 0;
  std::vector<std::string> policies = slicesched::ReplayPolicyNames();
  policies.push_back("all");
  if (int rc = Flags("replay")
                   .Text("--trace", &o.trace)
                   .Choice("--policy", policies, &o.policy)
                   .Text("--out", &o.out_dir)
                   .Switch("--no-progress", &no_progress)
                   .Switch("--sweep", &sweep)
                   .Int("--jobs", &jobs)
                   .Num("--minutes", &minutes)
                   .Num("--target-util", &o.target_util)
                   .Num("--load-scale", &o.load_scale)
                   .Num("--offline-rate", &o.offline_rate)
                   .Seed("--seed", &o.seed)
                   .Int("--threads", &o.threads)
                   .Parse(args)) {
    return rc;
  }
  o.progress = !no_progress;
  if (minutes != -1) o.minutes = minutes;
  if (sweep) return Sweep(o, minutes, jobs);
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("replay", v);
  auto r = slicesched::RunReplay(o);
  if (!r.ok()) return Failed("replay", r.status());
  std::printf("workload: %s, %.0f minutes, seed %llu, offline %.2f req/s\n", r->workload.c_str(), o.minutes,
              static_cast<unsigned long long>(o.seed), o.offline_rate);
  if (r->load_scale_fitted) {
    std::printf("load scale %.4f: Static-Online utilisation %.1f%% (target %.1f%% +- %.0f%%, %d runs)\n",
                r->load_scale, 100 * r->idle.utilization, 100 * o.target_util,
                100 * slicesched::kTargetUtilTolerance, r->fit_runs);
  } else {
    std::printf("load scale %.4f (given): Static-Online utilisation %.1f%%\n", r->load_scale,
                100 * r->idle.utilization);
  }
  std::printf("SLO: TTFT <= %.0f ms (Static-Online p90)\n", r->slo_ttft_ms);
  std::printf("%-17s %6s %6s %6s %6s %8s %8s %7s %7s %7s %7s %7s %7s %7s %7s\n", "policy", "req/s", "tok/s", "SLO",
              "util", "ttft50", "ttft99", "tbt50", "tbt99", "onl r/s", "off t/s", "off%", "harvest", "offlat50",
              "offlat90");
  for (const auto& p : r->policies) {
    std::printf("%-17s %6.3f %6.2f %5.1f%% %5.1f%% %7.0fms %7.0fms %5.0fms %5.0fms %7.3f %7.2f %6.1f%% %6.1f%% %6.1fs "
                "%6.1fs\n",
                p.policy.c_str(), p.req_per_s, p.tok_per_s, 100 * p.slo_attainment, 100 * p.gpu_util,
                p.ttft_p50_ms, p.ttft_p99_ms, p.tbt_p50_ms, p.tbt_p99_ms, p.online_req_per_s, p.offline_tok_per_s,
                100 * p.offline_completed_frac, 100 * p.harvest, p.offline_latency_p50_s, p.offline_latency_p90_s);
  }
  std::printf("Static-Online idle slices (10 ms..20 s): p50 %.0f ms, p90 %.0f ms, p99 %.0f ms; "
              "below-p99 share of idle time %.1f%%; utilisation %.1f%%\n",
              r->idle.p50_ms, r->idle.p90_ms, r->idle.p99_ms, 100 * r->idle.share_of_idle_below_p99,
              100 * r->idle.utilization);
  std::printf("idle overlap across the four model instances: pairwise Jaccard %.1f%%, all idle together %.1f%%\n",
              100 * r->overlap.pairwise_jaccard_mean, 100 * r->overlap.all_idle_share);
  for (const auto& p : r->policies) {
    if (p.round_p50_us > 0) {
      std::printf("%s decision latency: p50 %.0f us, p99 %.0f us over rounds with %.1f candidates on average\n",
                  p.policy.c_str(), p.round_p50_us, p.round_p99_us, p.mean_candidates);
    }
  }
  if (!o.out_dir.empty()) {
    const std::string script = std::string(SLICESCHED_SOURCE_DIR) + "/bench/plots/plot_replay.py";
    const std::string cmd = "/usr/bin/python3 '" + script + "' '" + o.out_dir + "' > /dev/null";
    if (std::system(cmd.c_str()) != 0) {
      std::fprintf(stderr, "slicesim replay: plots not drawn (needs /usr/bin/python3 with matplotlib); CSVs are in %s\n",
                   o.out_dir.c_str());
    } else {
      std::printf("wrote %s/summary.csv, idle_slices.csv, idle_overlap.csv and PNG plots\n", o.out_dir.c_str());
    }
  }
  return 0;
}

[[maybe_unused]] const bool kRegistered = RegisterCommands({
    {"gmg", &Gmg},
    {"bench-sim", &BenchSim},
    {"accuracy", &Accuracy},
    {"replay", &Replay},
});

}  // namespace
}  // namespace slicesim
