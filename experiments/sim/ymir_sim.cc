#include "slicesched/experiments/ymir_sim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <queue>
#include <random>
#include <sstream>
#include <system_error>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "slicesched/common/option_checks.h"
#include "slicesched/common/hash.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/workload/trace.h"
#include "ymir_policies.h"

namespace slicesched {
namespace {

constexpr double kWorkEps = 1e-6;  // 1-GPU seconds

// Standard normal from two hashes (Box-Muller; our own code so the values do
// not depend on the standard library).
double Normal(uint64_t h) {
  double u1 = std::max(Unit01(h), 1e-300);
  double u2 = Unit01(h ^ 0x5851f42d4c957f2dull);
  return std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
}

int ModeKey(ymir::Mode m) { return m == ymir::Mode::kSpatial ? 1 : 0; }

}  // namespace

// --- Workload ------------------------------------------------------------------

absl::StatusOr<std::vector<YmirSimJob>> LoadYmirJobs(const std::string& trace_path, int jobs, double load,
                                                     uint64_t seed, int cluster_gpus, const ymir::YmirGains& gains) {
  if (jobs < 1) return absl::InvalidArgumentError(StrCat("--jobs must be >= 1, got ", jobs));
  if (!(load > 0) || !std::isfinite(load)) return absl::InvalidArgumentError(StrCat("--load must be > 0, got ", load));
  if (cluster_gpus < 1) return absl::InvalidArgumentError("the cluster needs at least one GPU");
  const std::vector<std::string> tasks = gains.Tasks();
  if (tasks.empty()) return absl::InvalidArgumentError("the gains table names no tasks");
  SLICESCHED_ASSIGN_OR_RETURN(std::vector<Job> all, LoadJobTrace(trace_path));
  std::vector<Job> kept;
  for (const Job& j : all) {
    if (j.duration_s >= 60 && j.duration_s * j.num_gpus < 1000.0 * 3600 && j.num_gpus <= cluster_gpus) {
      kept.push_back(j);
    }
  }
  if (kept.empty()) {
    return absl::InvalidArgumentError(StrCat(trace_path, ": no job has duration >= 60 s, gpu_time < 1000 h and <= ",
                                             cluster_gpus, " GPUs"));
  }
  const size_t n = std::min(kept.size(), static_cast<size_t>(jobs));
  std::mt19937_64 rng(seed);
  const size_t start = static_cast<size_t>(rng() % (kept.size() - n + 1));
  std::vector<YmirSimJob> out;
  const double t0 = kept[start].submit_s;
  for (size_t i = start; i < start + n; ++i) {
    YmirSimJob j;
    j.submit_s = (kept[i].submit_s - t0) / load;
    j.duration_s = kept[i].duration_s;
    j.trace_gpus = kept[i].num_gpus;
    j.task = tasks[static_cast<size_t>(rng() % tasks.size())];
    out.push_back(std::move(j));
  }
  return out;
}

double YmirSpeedup(const YmirSimConfig& c, double g) {
  if (g <= 0) return 0;
  return g / (1 + c.sigma * (g - 1));
}

// --- The simulator ------------------------------------------------------------

namespace {

struct Unit {
  uint64_t uid = 0;
  YmirUnitMode mode = YmirUnitMode::kSingle;
  std::vector<int> jobs;
  int gpus = 0;
  bool ran = false;          // has ever held GPUs
  double stall_until = 0;
  double held_since = 0;     // when the current GPU count was set
  double remaining = 0;      // work of the current phase (realized)
  double future_real = 0;    // temporal phase 1 work still to come (realized)
  double future_pred = 0;    // the same as the planner predicts it
  double attained = 0;
  double realized_gain = 0;
  double decouple_at = -1;   // remaining work at which stop-loss fires (< 0: never)
  int phase = 0;             // temporal: 0 = source, 1 = target
};

class Simulator {
 public:
  Simulator(const std::vector<YmirSimJob>& jobs, const ymir::YmirGains& gains, const YmirSimConfig& config,
            YmirSimPolicy& policy)
      : jobs_(jobs), gains_(gains), c_(config), policy_(policy) {}

  absl::StatusOr<YmirSimResult> Run() {
    SLICESCHED_RETURN_IF_ERROR(Validate());
    const size_t n = jobs_.size();
    work_.resize(n);
    progress_.assign(n, false);
    tried_.assign(n, false);
    for (size_t i = 0; i < n; ++i) work_[i] = jobs_[i].duration_s * YmirSpeedup(c_, jobs_[i].trace_gpus);
    std::vector<int> arrival = IndicesSorted();
    result_.policy = policy_.Name();
    result_.jobs.assign(n, {});
    size_t next_arrival = 0;
    size_t done = 0;
    double now = 0;
    double next_tick = 0;
    std::vector<double> ilp;
    while (done < n) {
      double t = std::numeric_limits<double>::infinity();
      if (next_arrival < n) t = jobs_[static_cast<size_t>(arrival[next_arrival])].submit_s;
      if (!units_.empty()) t = std::min(t, next_tick);
      for (const Unit& u : units_) t = std::min(t, EventTime(u, now));
      if (!std::isfinite(t)) return absl::InternalError(StrCat(Name(), ": no next event with ", n - done, " jobs left"));
      t = std::max(t, now);
      Advance(now, t);
      now = t;
      // Unit events: phase ends, completions, stop-loss.
      std::vector<Unit> next_units;
      for (Unit& u : units_) {
        bool keep = true;
        for (int guard = 0; guard < 3 && keep; ++guard) {
          if (u.decouple_at >= 0 && u.remaining <= u.decouple_at + kWorkEps) {
            Decouple(u, now, &next_units);
            keep = false;
          } else if (u.remaining <= kWorkEps) {
            if (u.mode == YmirUnitMode::kTemporal && u.phase == 0) {
              Finish(u.jobs[0], now, u);
              ++done;
              u.phase = 1;
              u.remaining = u.future_real;
              u.future_real = u.future_pred = 0;
              if (u.realized_gain < 0) {
                u.decouple_at = std::max(0.0, u.remaining - c_.stop_loss_epochs / c_.epochs * work_[u.jobs[1]]);
              }
            } else {
              for (size_t k = (u.mode == YmirUnitMode::kTemporal ? 1 : 0); k < u.jobs.size(); ++k) {
                Finish(u.jobs[k], now, u);
                ++done;
              }
              keep = false;
            }
          } else {
            break;
          }
        }
        if (keep) next_units.push_back(std::move(u));
      }
      units_ = std::move(next_units);
      while (next_arrival < n && jobs_[static_cast<size_t>(arrival[next_arrival])].submit_s <= now) {
        Unit u;
        u.uid = next_uid_++;
        int j = arrival[next_arrival++];
        u.jobs = {j};
        u.remaining = work_[static_cast<size_t>(j)];
        units_.push_back(std::move(u));
      }
      const bool round = next_tick <= now;
      while (next_tick <= now) next_tick += c_.round_s;
      if (done == n) break;
      SLICESCHED_RETURN_IF_ERROR(Schedule(now, round, &ilp));
      bool any_running = std::any_of(units_.begin(), units_.end(), [](const Unit& u) { return u.gpus > 0; });
      if (!any_running && next_arrival >= n && !units_.empty()) {
        return absl::InternalError(StrCat(Name(), " left ", units_.size(), " units waiting on an idle cluster"));
      }
    }
    // Metrics.
    std::vector<double> jct;
    double first = std::numeric_limits<double>::infinity(), last = 0;
    for (size_t i = 0; i < n; ++i) {
      const auto& o = result_.jobs[i];
      jct.push_back(o.jct_s);
      first = std::min(first, jobs_[i].submit_s);
      last = std::max(last, o.finish_s);
      if (o.transfer == ymir::Mode::kTemporal) ++result_.temporal_jobs;
      if (o.transfer == ymir::Mode::kSpatial) ++result_.spatial_jobs;
      if (o.decoupled) ++result_.decoupled_jobs;
    }
    result_.avg_jct_s = std::accumulate(jct.begin(), jct.end(), 0.0) / static_cast<double>(n);
    std::sort(jct.begin(), jct.end());
    double rank = 0.99 * static_cast<double>(n - 1);
    size_t lo = static_cast<size_t>(std::floor(rank));
    size_t hi = std::min(n - 1, lo + 1);
    result_.p99_jct_s = jct[lo] + (jct[hi] - jct[lo]) * (rank - static_cast<double>(lo));
    result_.makespan_s = last - first;
    result_.transfer_share = static_cast<double>(result_.temporal_jobs + result_.spatial_jobs) / static_cast<double>(n);
    result_.ilp_calls = static_cast<int>(ilp.size());
    if (!ilp.empty()) {
      result_.ilp_avg_s = std::accumulate(ilp.begin(), ilp.end(), 0.0) / static_cast<double>(ilp.size());
      result_.ilp_max_s = *std::max_element(ilp.begin(), ilp.end());
    }
    return std::move(result_);
  }

 private:
  std::string Name() const { return policy_.Name(); }

  absl::Status Validate() const {
    if (jobs_.empty()) return absl::InvalidArgumentError("no jobs to simulate");
    if (c_.gpus < 1 || c_.gpus_per_node < 1) {
      return absl::InvalidArgumentError(StrCat("bad cluster: ", c_.gpus, " GPUs, ", c_.gpus_per_node, " per node"));
    }
    if (!(c_.round_s > 0) || c_.restart_s < 0 || !(c_.epochs > 0) || c_.sigma < 0 || c_.sigma >= 1) {
      return absl::InvalidArgumentError("bad simulator config");
    }
    for (size_t i = 0; i < jobs_.size(); ++i) {
      const auto& j = jobs_[i];
      if (!(j.submit_s >= 0) || !(j.duration_s > 0) || j.trace_gpus < 1 || j.trace_gpus > c_.gpus) {
        return absl::InvalidArgumentError(StrCat("job ", i, ": bad submit/duration/GPUs (", j.submit_s, ", ",
                                                 j.duration_s, ", ", j.trace_gpus, " on a ", c_.gpus,
                                                 "-GPU cluster)"));
      }
    }
    return absl::OkStatus();
  }

  std::vector<int> IndicesSorted() const {
    std::vector<int> v = ymir_policies_internal::Indices(jobs_.size());
    std::stable_sort(v.begin(), v.end(), [&](int a, int b) {
      return jobs_[static_cast<size_t>(a)].submit_s < jobs_[static_cast<size_t>(b)].submit_s;
    });
    return v;
  }

  double Rate(const Unit& u) const { return YmirSpeedup(c_, u.gpus); }

  // When the unit's current phase ends or its stop-loss fires.
  double EventTime(const Unit& u, double now) const {
    if (u.gpus <= 0) return std::numeric_limits<double>::infinity();
    double target = u.decouple_at >= 0 ? u.decouple_at : 0;
    return std::max(now, u.stall_until) + std::max(0.0, u.remaining - target) / Rate(u);
  }

  void Advance(double from, double to) {
    for (Unit& u : units_) {
      if (u.gpus <= 0) continue;
      u.attained += u.gpus * (to - from);
      double busy = to - std::max(from, u.stall_until);
      if (busy <= 0) continue;
      u.remaining -= busy * Rate(u);
      if (u.mode == YmirUnitMode::kTemporal) {
        progress_[static_cast<size_t>(u.jobs[static_cast<size_t>(u.phase)])] = true;
      } else {
        for (int j : u.jobs) progress_[static_cast<size_t>(j)] = true;
      }
    }
  }

  void Finish(int j, double now, const Unit& u) {
    auto& o = result_.jobs[static_cast<size_t>(j)];
    o.finish_s = now;
    o.jct_s = now - jobs_[static_cast<size_t>(j)].submit_s;
    o.final_gpus = u.gpus;
    if (u.mode == YmirUnitMode::kTemporal) o.transfer = ymir::Mode::kTemporal;
    if (u.mode == YmirUnitMode::kSpatial) o.transfer = ymir::Mode::kSpatial;
  }

  // Stop-loss: the transferring phase's work so far is lost; the jobs that
  // are left continue alone with their full iterations.
  void Decouple(const Unit& u, double now, std::vector<Unit>* out) {
    size_t first = u.mode == YmirUnitMode::kTemporal ? 1 : 0;
    for (size_t k = first; k < u.jobs.size(); ++k) {
      int j = u.jobs[k];
      result_.jobs[static_cast<size_t>(j)].decoupled = true;
      result_.jobs[static_cast<size_t>(j)].transfer =
          u.mode == YmirUnitMode::kTemporal ? ymir::Mode::kTemporal : ymir::Mode::kSpatial;
      Unit s;
      s.uid = next_uid_++;
      s.jobs = {j};
      s.remaining = work_[static_cast<size_t>(j)];
      s.ran = true;
      s.attained = u.attained / static_cast<double>(u.jobs.size() - first);
      out->push_back(std::move(s));
    }
    log_line_ += StrCat(" decouple ", u.uid, "@", now);
  }

  YmirUnitView View(const Unit& u) const {
    YmirUnitView v;
    v.uid = u.uid;
    v.mode = u.mode;
    v.jobs = u.jobs;
    v.gpus = u.gpus;
    v.held_since_s = u.held_since;
    v.ran = u.ran;
    v.submit_s = std::numeric_limits<double>::infinity();
    for (int j : u.jobs) {
      const auto& job = jobs_[static_cast<size_t>(j)];
      v.submit_s = std::min(v.submit_s, job.submit_s);
      v.total_work += work_[static_cast<size_t>(j)];
      v.trace_gpus = std::max(v.trace_gpus, job.trace_gpus);
    }
    v.remaining_work = std::max(0.0, u.remaining) + u.future_pred;
    v.attained_gpu_s = u.attained;
    int max_g = std::min(c_.gpus, std::max(c_.gpus_per_node, 2 * v.trace_gpus));
    for (int g = 1; g <= max_g; g *= 2) v.allowed_gpus.push_back(g);
    if (v.trace_gpus <= max_g) v.allowed_gpus.push_back(v.trace_gpus);
    std::sort(v.allowed_gpus.begin(), v.allowed_gpus.end());
    v.allowed_gpus.erase(std::unique(v.allowed_gpus.begin(), v.allowed_gpus.end()), v.allowed_gpus.end());
    if (u.mode == YmirUnitMode::kSingle) {
      int j = u.jobs[0];
      v.task = jobs_[static_cast<size_t>(j)].task;
      v.fresh = !progress_[static_cast<size_t>(j)] && !u.ran;
      v.pairable = !tried_[static_cast<size_t>(j)];
    }
    return v;
  }

  double Realized(const std::string& a, const std::string& b, ymir::Mode mode, double predicted) const {
    uint64_t h = Fnv1a(b, Fnv1a(a, Mix(c_.seed))) ^ static_cast<uint64_t>(ModeKey(mode) + 1);
    double g = predicted + std::abs(predicted) * c_.gain_noise_rel * Normal(h) + c_.gain_noise_abs * Normal(Mix(h));
    return std::min(g, 0.95);
  }

  absl::Status Schedule(double now, bool round, std::vector<double>* ilp) {
    YmirSimState state;
    state.now = now;
    state.round = round;
    state.config = &c_;
    state.gains = &gains_;
    for (const Unit& u : units_) state.units.push_back(View(u));
    SLICESCHED_ASSIGN_OR_RETURN(YmirSimDecision d, policy_.Decide(state));
    ++result_.decisions;
    if (d.solve_s >= 0) ilp->push_back(d.solve_s);
    const size_t n = units_.size();
    if (d.gpus.size() != n) {
      return absl::InternalError(StrCat(Name(), " returned ", d.gpus.size(), " allocations for ", n, " units"));
    }
    std::string line = StrCat("t=", now, ":");
    std::vector<bool> paired(n, false);
    std::vector<Unit> formed;
    for (const auto& p : d.pairs) {
      if (p.source < 0 || p.target < 0 || static_cast<size_t>(p.source) >= n || static_cast<size_t>(p.target) >= n ||
          p.source == p.target || paired[static_cast<size_t>(p.source)] || paired[static_cast<size_t>(p.target)]) {
        return absl::InternalError(StrCat(Name(), ": bad pair ", p.source, " -> ", p.target));
      }
      const Unit& A = units_[static_cast<size_t>(p.source)];
      const Unit& B = units_[static_cast<size_t>(p.target)];
      const YmirUnitView va = state.units[static_cast<size_t>(p.source)];
      const YmirUnitView vb = state.units[static_cast<size_t>(p.target)];
      double pred = 0;
      const bool spatial = p.mode == ymir::Mode::kSpatial;
      if (A.mode != YmirUnitMode::kSingle || B.mode != YmirUnitMode::kSingle || !va.pairable || !vb.pairable ||
          !vb.fresh || (spatial && !va.fresh) || ymir::YmirBackbone(va.task) != ymir::YmirBackbone(vb.task) ||
          !gains_.Get(va.task, vb.task, p.mode, &pred) ||
          std::find(va.allowed_gpus.begin(), va.allowed_gpus.end(), p.gpus) == va.allowed_gpus.end()) {
        return absl::InternalError(StrCat(Name(), ": ineligible ", ymir::ModeName(p.mode), " pair ", va.uid, " -> ",
                                          vb.uid, " on ", p.gpus, " GPUs"));
      }
      paired[static_cast<size_t>(p.source)] = paired[static_cast<size_t>(p.target)] = true;
      const int a = A.jobs[0], b = B.jobs[0];
      tried_[static_cast<size_t>(a)] = tried_[static_cast<size_t>(b)] = true;
      Unit u;
      u.uid = next_uid_++;
      u.jobs = {a, b};
      u.realized_gain = Realized(va.task, vb.task, p.mode, pred);
      u.attained = A.attained;
      if (spatial) {
        u.mode = YmirUnitMode::kSpatial;
        const double w = (work_[static_cast<size_t>(a)] + work_[static_cast<size_t>(b)]) * c_.spatial_overhead;
        u.remaining = (1 - u.realized_gain) * w;
        if (u.realized_gain < 0) u.decouple_at = u.remaining - c_.stop_loss_epochs / c_.epochs * w;
      } else {
        u.mode = YmirUnitMode::kTemporal;
        u.remaining = A.remaining;
        u.future_real = (1 - u.realized_gain) * work_[static_cast<size_t>(b)];
        u.future_pred = (1 - pred) * work_[static_cast<size_t>(b)];
        u.ran = A.ran;
        u.gpus = A.gpus;  // for the restart rule below
        u.stall_until = A.stall_until;
      }
      line += StrCat(" ", ymir::ModeName(p.mode), "(", A.uid, ",", B.uid, ")->", u.uid, "@", p.gpus);
      formed.push_back(std::move(u));
      SetGpus(&formed.back(), p.gpus, now);
    }
    std::vector<Unit> next;
    for (size_t i = 0; i < n; ++i) {
      if (paired[i]) continue;
      Unit& u = units_[i];
      int g = d.gpus[i];
      if (g != 0) {
        const auto& allowed = state.units[i].allowed_gpus;
        if (std::find(allowed.begin(), allowed.end(), g) == allowed.end()) {
          return absl::InternalError(StrCat(Name(), ": unit ", u.uid, " given ", g, " GPUs (not an allowed count)"));
        }
      }
      if (g != u.gpus) line += StrCat(" ", u.uid, ":", u.gpus, "->", g);
      SetGpus(&u, g, now);
      next.push_back(std::move(u));
    }
    for (Unit& u : formed) next.push_back(std::move(u));
    units_ = std::move(next);
    // Capacity: in total and per node.
    std::vector<int> counts;
    int used = 0;
    for (const Unit& u : units_) {
      if (u.gpus > 0) counts.push_back(u.gpus);
      used += u.gpus;
    }
    if (used > c_.gpus) {
      return absl::InternalError(StrCat(Name(), " over-allocated at t=", now, ": ", used, " GPUs on ", c_.gpus));
    }
    SLICESCHED_ASSIGN_OR_RETURN(auto placement, ymir::PackOntoNodes(counts, {c_.gpus, c_.gpus_per_node}));
    std::vector<int> node_used(static_cast<size_t>((c_.gpus + c_.gpus_per_node - 1) / c_.gpus_per_node), 0);
    for (const auto& slices : placement) {
      for (const auto& s : slices) {
        node_used[static_cast<size_t>(s.node)] += s.gpus;
        if (node_used[static_cast<size_t>(s.node)] > c_.gpus_per_node) {
          return absl::InternalError(StrCat(Name(), " over-allocated node ", s.node, " at t=", now));
        }
      }
    }
    result_.peak_gpus = std::max(result_.peak_gpus, used);
    result_.log.push_back(line + log_line_);
    log_line_.clear();
    return absl::OkStatus();
  }

  void SetGpus(Unit* u, int g, double now) {
    if (g > 0 && ((u->gpus > 0 && g != u->gpus) || (u->gpus == 0 && u->ran))) {
      u->stall_until = now + c_.restart_s;
      ++result_.restarts;
    }
    if (g > 0) u->ran = true;
    if (g != u->gpus) u->held_since = now;
    u->gpus = g;
  }

  const std::vector<YmirSimJob>& jobs_;
  const ymir::YmirGains& gains_;
  const YmirSimConfig& c_;
  YmirSimPolicy& policy_;
  std::vector<double> work_;
  std::vector<bool> progress_, tried_;
  std::vector<Unit> units_;
  uint64_t next_uid_ = 1;
  YmirSimResult result_;
  std::string log_line_;
};

}  // namespace

absl::StatusOr<YmirSimResult> RunYmirSim(const std::vector<YmirSimJob>& jobs, const ymir::YmirGains& gains,
                                         const YmirSimConfig& config, YmirSimPolicy& policy) {
  Simulator sim(jobs, gains, config, policy);
  return sim.Run();
}

// --- Reporting and the command ---------------------------------------------

std::string YmirSimResult::ToJson() const {
  char buf[1024];
  std::snprintf(buf, sizeof(buf),
                "{\"policy\": \"%s\", \"avg_jct_s\": %.1f, \"p99_jct_s\": %.1f, \"makespan_s\": %.1f, "
                "\"transfer_share\": %.4f, \"temporal_jobs\": %d, \"spatial_jobs\": %d, \"decoupled_jobs\": %d, "
                "\"restarts\": %d, \"decisions\": %d, \"peak_gpus\": %d, \"ilp_calls\": %d, "
                "\"ilp_avg_s\": %s, \"ilp_max_s\": %s}",
                policy.c_str(), avg_jct_s, p99_jct_s, makespan_s, transfer_share, temporal_jobs, spatial_jobs,
                decoupled_jobs, restarts, decisions, peak_gpus, ilp_calls,
                ilp_calls > 0 ? StrCat(ilp_avg_s).c_str() : "null", ilp_calls > 0 ? StrCat(ilp_max_s).c_str() : "null");
  return buf;
}

std::string YmirCompareResult::ToJson(const YmirCompareOptions& o) const {
  std::string out = StrCat("{\"trace\": \"", trace, "\", \"gains\": \"", gains, "\", \"gains_used\": \"",
                           gains_source.Describe(), "\", \"gains_column\": \"",
                           gains_source.format == 0 ? "stand-in" : gains_source.column,
                           "\", \"gains_censored_rows\": ", gains_source.censored_rows, ", \"jobs\": ", jobs,
                           ", \"load\": ", o.load, ", \"gpus\": ", o.config.gpus, ", \"nodes\": ", o.nodes,
                           ", \"seed\": ", o.config.seed, ", \"policies\": [");
  for (size_t i = 0; i < policies.size(); ++i) out += (i ? ",\n  " : "\n  ") + policies[i].ToJson();
  return out + "\n]}";
}

std::string YmirCompareResult::ToText() const {
  std::string out = StrCat(jobs, " jobs from ", trace, "; gains: ", gains, " [", gains_source.Describe(), "]\n");
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%-13s %11s %11s %11s %9s %9s %11s %11s\n", "policy", "avg JCT s", "p99 JCT s",
                "makespan s", "transfer", "restarts", "ILP avg s", "ILP max s");
  out += buf;
  for (const auto& p : policies) {
    std::snprintf(buf, sizeof(buf), "%-13s %11.0f %11.0f %11.0f %8.1f%% %9d %11.4f %11.4f\n", p.policy.c_str(),
                  p.avg_jct_s, p.p99_jct_s, p.makespan_s, 100 * p.transfer_share, p.restarts, p.ilp_avg_s,
                  p.ilp_max_s);
    out += buf;
  }
  return out;
}

absl::Status YmirCompareOptions::Validate() const {
  if (jobs < 1) return OptionOutOfRange("--jobs", "at least 1", jobs);
  if (!(load > 0) || !std::isfinite(load)) return OptionOutOfRange("--load", "> 0", load);
  if (config.gpus < 1) return OptionOutOfRange("--gpus", "at least 1", config.gpus);
  if (nodes < 1) return OptionOutOfRange("--nodes", "at least 1", nodes);
  if (config.gpus % nodes != 0) {
    return absl::InvalidArgumentError(
        StrCat("--gpus (", config.gpus, ") must be a multiple of --nodes (", nodes, ")"));
  }
  if (!(config.round_s > 0) || !std::isfinite(config.round_s)) {
    return OptionOutOfRange("--round", "> 0", config.round_s);
  }
  if (!(config.restart_s >= 0) || !std::isfinite(config.restart_s)) {
    return OptionOutOfRange("--restart", "at least 0", config.restart_s);
  }
  if (config.ilp_window < 1) return OptionOutOfRange("--ilp-window", "at least 1", config.ilp_window);
  if (!(config.ilp_gap >= 0) || !std::isfinite(config.ilp_gap)) {
    return OptionOutOfRange("--ilp-gap", "at least 0", config.ilp_gap);
  }
  if (!(config.ilp_time_limit_s > 0) || !std::isfinite(config.ilp_time_limit_s)) {
    return OptionOutOfRange("--ilp-time-limit", "> 0", config.ilp_time_limit_s);
  }
  if (policy != "all") {
    const std::vector<std::string> names = YmirSimPolicyNames();
    if (std::find(names.begin(), names.end(), policy) == names.end()) {
      return OptionOutOfRange("--policy", "Ymir, Ymir-elastic, Tiresias, Optimus, Pollux, Themis, SRTF or all", policy);
    }
  }
  if (!gains_definition.empty() && gains_definition != "saved" && gains_definition != "speedup") {
    return OptionOutOfRange("--gains-definition", "saved or speedup", gains_definition);
  }
  if (!gains_column.empty() && gains_column != "gain" && gains_column != "gain_steps") {
    return OptionOutOfRange("--gains-column", "gain or gain_steps", gains_column);
  }
  return absl::OkStatus();
}

absl::StatusOr<YmirCompareResult> RunYmirCompare(const YmirCompareOptions& options) {
  SLICESCHED_RETURN_IF_ERROR(options.Validate());
  YmirCompareOptions o = options;
  o.config.gpus_per_node = o.config.gpus / o.nodes;
  YmirCompareResult r;
  if (o.trace.empty()) {
#ifdef SLICESCHED_SOURCE_DIR
    std::string shared = std::string(SLICESCHED_SOURCE_DIR) + "/../shared";
#else
    std::string shared = "../shared";
#endif
    if (!o.shared_dir.empty()) shared = o.shared_dir;
    if (!std::ifstream(shared + "/traces/philly_jobs_pollux.csv")) {
      return absl::NotFoundError(StrCat("no --trace given and the default trace ", shared,
                                        "/traces/philly_jobs_pollux.csv is absent; pass --trace FILE (a job table "
                                        "with timestamp, duration, num_gpus columns)"));
    }
    o.trace = shared + "/traces/philly_jobs_pollux.csv";
  }
  ymir::YmirGains gains;
  if (o.gains.empty()) {
    gains = ymir::DefaultYmirGains();
    r.gains = "default stand-in (paper's reported distribution, not measured)";
  } else {
    ymir::YmirGainsLoadOptions load{.column = o.gains_column};
    if (!o.gains_definition.empty()) {  // else the file's directive (Validate() checked the name)
      load.definition = o.gains_definition == "saved" ? ymir::YmirGainsDefinition::kSaved : ymir::YmirGainsDefinition::kSpeedup;
    }
    SLICESCHED_ASSIGN_OR_RETURN(gains, ymir::LoadYmirGains(o.gains, load));
    r.gains = o.gains;
    const std::vector<std::string> tasks = gains.Tasks();
    if (std::none_of(tasks.begin(), tasks.end(), [](const std::string& t) { return t.find('/') != std::string::npos; })) {
      if (o.backbones.empty()) return absl::InvalidArgumentError("no backbones to map the gains table's tasks onto");
      gains = gains.WithBackbones(o.backbones);
      r.gains += " (tasks replicated per backbone:";
      for (const auto& bb : o.backbones) r.gains += " " + bb;
      r.gains += ")";
    }
  }
  r.gains_source = gains.source();
  SLICESCHED_ASSIGN_OR_RETURN(std::vector<YmirSimJob> jobs,
                              LoadYmirJobs(o.trace, o.jobs, o.load, o.config.seed, o.config.gpus, gains));
  r.trace = o.trace;
  r.jobs = static_cast<int>(jobs.size());
  std::vector<std::string> names = o.policy == "all" ? YmirSimPolicyNames() : std::vector<std::string>{o.policy};
  for (const auto& name : names) {
    SLICESCHED_ASSIGN_OR_RETURN(auto policy, MakeYmirSimPolicy(name));
    SLICESCHED_ASSIGN_OR_RETURN(YmirSimResult res, RunYmirSim(jobs, gains, o.config, *policy));
    res.log.clear();
    r.policies.push_back(std::move(res));
  }
  return r;
}

}  // namespace slicesched
