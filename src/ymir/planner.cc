#include "slicesched/ymir/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <unordered_map>
#include <utility>

#include "coin/Cbc_C_Interface.h"
#include "slicesched/common/strings.h"

namespace slicesched::ymir {
namespace {

using Clock = std::chrono::steady_clock;

double IterTime(const JobView& job, int g) {
  if (g < job.min_gpus || g > job.max_gpus || g <= 0) return 0;
  if (static_cast<size_t>(g) >= job.iter_time_s.size()) return 0;
  return job.iter_time_s[static_cast<size_t>(g)];
}

Status Validate(const std::vector<JobView>& jobs, const ClusterView& cluster,
                const PlannerOptions& options) {
  if (cluster.gpus < 0 || cluster.gpus_per_node <= 0) {
    return absl::InvalidArgumentError(
        slicesched::StrCat("bad cluster: gpus=", cluster.gpus,
                           " gpus_per_node=", cluster.gpus_per_node));
  }
  if (options.round_s < 0 || options.time_limit_s <= 0 || !(options.relative_gap >= 0) ||
      !(options.horizon_s >= 0) || !std::isfinite(options.horizon_s)) {
    return absl::InvalidArgumentError("bad planner options");
  }
  std::unordered_map<uint64_t, int> seen;
  for (const JobView& job : jobs) {
    if (!seen.emplace(job.id, 0).second) {
      return absl::InvalidArgumentError(slicesched::StrCat("duplicate job id ", job.id));
    }
    if (!(job.fair_share_jct_s > 0) || job.remaining_iterations < 0 ||
        job.waited_s < 0 || job.min_gpus < 1 || job.max_gpus < job.min_gpus) {
      return absl::InvalidArgumentError(slicesched::StrCat("bad job ", job.id));
    }
    if (!(job.reference_iter_time_s >= 0) || !std::isfinite(job.reference_iter_time_s) ||
        !(job.restart_s >= 0) || !std::isfinite(job.restart_s) || job.current_gpus < 0) {
      return absl::InvalidArgumentError(slicesched::StrCat(
          "job ", job.id, ": reference_iter_time_s, restart_s and current_gpus must be >= 0"));
    }
    for (double t : job.iter_time_s) {
      if (t < 0 || !std::isfinite(t)) {
        return absl::InvalidArgumentError(
            slicesched::StrCat("bad iter_time_s for job ", job.id));
      }
    }
  }
  return absl::OkStatus();
}

struct MergedPair {
  int a = 0, b = 0;  // job indices
  bool has_temporal_ab = false, has_temporal_ba = false;
  double temporal_ab = 0, temporal_ba = 0;
  double spatial_gain_sum = 0, spatial_factor_sum = 0;
  int spatial_count = 0;
  bool spatial_single_stream = false;
};

// One stretch of work of a candidate: `iters` iterations at `t` seconds each
// on the candidate's GPUs, or at `t_ref` once the horizon has passed.
struct Phase {
  double iters = 0;
  double t = 0;
  double t_ref = 0;
};

// Finish time of each phase (run back to back) when the allocation holds for
// `horizon` seconds (0: forever) and the work starts after `stall` seconds.
std::vector<double> PhaseFinish(const std::vector<Phase>& phases, double stall,
                                double horizon) {
  std::vector<double> out;
  double now = stall;
  for (const Phase& p : phases) {
    const double ref = p.t_ref > 0 ? p.t_ref : p.t;
    if (horizon <= 0 || now + p.iters * p.t <= horizon) {
      now += p.iters * p.t;
    } else if (now >= horizon) {
      now += p.iters * ref;
    } else {
      const double done = (horizon - now) / p.t;
      now = horizon + (p.iters - done) * ref;
    }
    out.push_back(now);
  }
  return out;
}

double Stall(const JobView& job, int g) { return g != job.current_gpus ? job.restart_s : 0.0; }

bool Eligible(const JobView& a, const JobView& b) {
  return a.backbone == b.backbone && a.allow_sharing && b.allow_sharing &&
         a.trust_domain == b.trust_domain;
}

}  // namespace

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kWait: return "wait";
    case Mode::kNormal: return "normal";
    case Mode::kTemporal: return "temporal";
    case Mode::kSpatial: return "spatial";
  }
  return "?";
}

StatusOr<CandidateSet> GenerateCandidates(const std::vector<JobView>& jobs,
                                          const std::vector<PairEstimate>& pairs,
                                          const ClusterView& cluster,
                                          const PlannerOptions& options) {
  SLICESCHED_RETURN_IF_ERROR(Validate(jobs, cluster, options));
  CandidateSet set;
  const int n = static_cast<int>(jobs.size());
  auto slowdown = [&](int j, double jct) {
    return (jobs[j].waited_s + jct) / jobs[j].fair_share_jct_s;
  };

  // Normal + wait.
  for (int j = 0; j < n; ++j) {
    const JobView& job = jobs[j];
    double slowest = -1, slowest_t = 0;
    for (int g = job.min_gpus; g <= std::min(job.max_gpus, cluster.gpus); ++g) {
      double t = IterTime(job, g);
      if (t <= 0) continue;
      Candidate c;
      c.mode = Mode::kNormal;
      c.jobs = {j};
      c.gpus = g;
      double jct = PhaseFinish({{job.remaining_iterations, t, job.reference_iter_time_s}},
                               Stall(job, g), options.horizon_s)[0];
      c.jct_s = {jct};
      c.slowdown = {slowdown(j, jct)};
      if (jct > slowest) slowest_t = t;
      slowest = std::max(slowest, jct);
      set.candidates.push_back(std::move(c));
    }
    Candidate w;
    w.mode = Mode::kWait;
    w.jobs = {j};
    w.gpus = 0;
    double jct = options.round_s + (slowest >= 0 ? slowest : job.fair_share_jct_s);
    if (options.horizon_s > 0) {
      // No progress for the horizon, then the reference speed (the slowest
      // allowed speed when no reference is given).
      const double ref = job.reference_iter_time_s > 0 ? job.reference_iter_time_s : slowest_t;
      jct = ref > 0 ? options.horizon_s + job.restart_s + job.remaining_iterations * ref
                    : options.horizon_s + job.fair_share_jct_s;
    }
    w.jct_s = {jct};
    w.slowdown = {slowdown(j, jct)};
    set.candidates.push_back(std::move(w));
  }

  // Merge pair estimates per unordered pair.
  std::unordered_map<uint64_t, int> index;
  for (int j = 0; j < n; ++j) index[jobs[j].id] = j;
  std::map<std::pair<int, int>, MergedPair> merged;
  for (const PairEstimate& p : pairs) {
    auto ia = index.find(p.a);
    auto ib = index.find(p.b);
    if (ia == index.end() || ib == index.end() || ia->second == ib->second) continue;
    int a = ia->second, b = ib->second;
    if (!Eligible(jobs[a], jobs[b])) continue;
    auto key = std::minmax(a, b);
    MergedPair& m = merged[{key.first, key.second}];
    m.a = key.first;
    m.b = key.second;
    if (a == m.a) {
      m.has_temporal_ab = true;
      m.temporal_ab = p.temporal_gain_ab;
    } else {
      m.has_temporal_ba = true;
      m.temporal_ba = p.temporal_gain_ab;
    }
    m.spatial_gain_sum += p.spatial_gain;
    m.spatial_factor_sum += p.spatial_iter_time_factor;
    m.spatial_single_stream |= p.spatial_single_stream;
    ++m.spatial_count;
  }

  for (const auto& [key, m] : merged) {
    const JobView& A = jobs[m.a];
    const JobView& B = jobs[m.b];
    const bool spatial_ok = (!A.has_progress && !B.has_progress) ||
                            (A.joint_partner == B.id && B.joint_partner == A.id && A.id != 0);
    int lo = std::max(A.min_gpus, B.min_gpus);
    int hi = std::min({A.max_gpus, B.max_gpus, cluster.gpus});
    for (int g = lo; g <= hi; ++g) {
      double ta = IterTime(A, g), tb = IterTime(B, g);
      if (ta <= 0 || tb <= 0) continue;
      double TA = A.remaining_iterations * ta;
      double TB = B.remaining_iterations * tb;
      double srtf_sum = 2 * std::min(TA, TB) + std::max(TA, TB);
      // jct_*: on g GPUs until both finish (defines TranWt, which measures
      // the transfer, not the allocation); the predicted JCTs (and the
      // slowdowns) also apply the horizon and the reconfiguration cost.
      auto add = [&](Mode mode, int first, int second, double jct_first,
                     double jct_second, const std::vector<double>& predicted) {
        Candidate c;
        c.mode = mode;
        c.jobs = {first, second};
        c.gpus = g;
        c.jct_s = predicted;
        c.slowdown = {slowdown(first, predicted[0]), slowdown(second, predicted[1])};
        double sum = jct_first + jct_second;
        c.tran_wt = sum > 0 ? srtf_sum / sum : 1.0;
        if (c.tran_wt < options.min_tran_wt) {
          ++set.pruned;
          return;
        }
        set.candidates.push_back(std::move(c));
      };
      const double H = options.horizon_s;
      // After the horizon a pair keeps both members' fair shares: its
      // reference speed is the sum of theirs (0 when either has none: the
      // candidate's own speed).
      const double ref_a = A.reference_iter_time_s, ref_b = B.reference_iter_time_s;
      const double pair_ref = ref_a > 0 && ref_b > 0 ? 1 / (1 / ref_a + 1 / ref_b) : 0.0;
      auto temporal = [&](const JobView& src, const JobView& dst, double t_src, double t_dst,
                          double gain) {
        return PhaseFinish({{src.remaining_iterations, t_src, pair_ref},
                            {(1 - gain) * dst.remaining_iterations, t_dst, pair_ref}},
                           Stall(src, g), H);
      };
      // A temporal target starts from its source's trained parameters: one
      // that has trained already cannot (it would only wait for the source).
      if (m.has_temporal_ab && !B.has_progress) {
        add(Mode::kTemporal, m.a, m.b, TA, TA + (1 - m.temporal_ab) * TB,
            temporal(A, B, ta, tb, m.temporal_ab));
      }
      if (m.has_temporal_ba && !A.has_progress) {
        add(Mode::kTemporal, m.b, m.a, TB, TB + (1 - m.temporal_ba) * TA,
            temporal(B, A, tb, ta, m.temporal_ba));
      }
      // A single-stream pair runs its joint iterations at its members'
      // one-stream speed (their times at gpus.min) whatever g is, so it is
      // offered only the smallest count both allow.
      if (spatial_ok && m.spatial_count > 0 && (!m.spatial_single_stream || g == lo)) {
        double gain = m.spatial_gain_sum / m.spatial_count;
        double factor = m.spatial_factor_sum / m.spatial_count;
        double iters = (1 - gain) * (A.remaining_iterations + B.remaining_iterations);
        double t_joint = std::max(ta, tb);
        if (m.spatial_single_stream) {
          const double one_a = IterTime(A, A.min_gpus), one_b = IterTime(B, B.min_gpus);
          if (one_a > 0 && one_b > 0) t_joint = std::max(one_a, one_b);
        }
        double joint = iters * factor * t_joint;
        double end = PhaseFinish({{iters, factor * t_joint, factor * pair_ref}},
                                 std::max(Stall(A, g), Stall(B, g)), H)[0];
        add(Mode::kSpatial, m.a, m.b, joint, joint, {end, end});
      }
    }
  }
  return set;
}

namespace {

// Objective coefficient of x_c (without the z term).
double ColumnCost(const Candidate& c, int num_jobs, const PlannerOptions& options) {
  double s = 0;
  for (double v : c.slowdown) s += v;
  return options.alpha / std::max(num_jobs, 1) * s - options.lambda * (c.tran_wt - 1.0);
}

}  // namespace

double SelectionObjective(const CandidateSet& set, const std::vector<int>& selected,
                          int num_jobs, const PlannerOptions& options) {
  double z = 0;
  double cost = 0;
  for (int i : selected) {
    const Candidate& c = set.candidates[static_cast<size_t>(i)];
    for (double v : c.slowdown) z = std::max(z, v);
    cost += ColumnCost(c, num_jobs, options);
  }
  return z + cost;
}

StatusOr<std::vector<std::vector<NodeSlice>>> PackOntoNodes(const std::vector<int>& gpus,
                                                            const ClusterView& cluster) {
  if (cluster.gpus_per_node <= 0 || cluster.gpus < 0) {
    return absl::InvalidArgumentError("bad cluster");
  }
  long total = 0;
  for (int g : gpus) {
    if (g < 0) return absl::InvalidArgumentError("negative GPU count");
    total += g;
  }
  if (total > cluster.gpus) {
    return absl::InvalidArgumentError(slicesched::StrCat(
        "packing ", total, " GPUs onto a cluster of ", cluster.gpus));
  }
  const int per = cluster.gpus_per_node;
  const int nodes = (cluster.gpus + per - 1) / per;
  std::vector<int> free(static_cast<size_t>(nodes), per);
  if (nodes > 0 && cluster.gpus % per != 0) free.back() = cluster.gpus % per;

  std::vector<size_t> order(gpus.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return gpus[x] > gpus[y]; });
  std::vector<std::vector<NodeSlice>> out(gpus.size());
  for (size_t i : order) {
    int need = gpus[i];
    if (need == 0) continue;
    // First fit on a single node.
    bool placed = false;
    for (int n = 0; n < nodes && need <= per; ++n) {
      if (free[static_cast<size_t>(n)] >= need) {
        free[static_cast<size_t>(n)] -= need;
        out[i].push_back({n, need});
        placed = true;
        break;
      }
    }
    if (placed) continue;
    // Span: take the nodes with the most free GPUs first (fewest nodes).
    std::vector<int> by_free(static_cast<size_t>(nodes));
    std::iota(by_free.begin(), by_free.end(), 0);
    std::stable_sort(by_free.begin(), by_free.end(), [&](int x, int y) {
      return free[static_cast<size_t>(x)] > free[static_cast<size_t>(y)];
    });
    for (int n : by_free) {
      if (need == 0) break;
      int take = std::min(need, free[static_cast<size_t>(n)]);
      if (take == 0) break;
      free[static_cast<size_t>(n)] -= take;
      need -= take;
      out[i].push_back({n, take});
    }
    std::sort(out[i].begin(), out[i].end(),
              [](const NodeSlice& x, const NodeSlice& y) { return x.node < y.node; });
  }
  return out;
}

namespace {

StatusOr<PlanResult> Finish(const std::vector<JobView>& jobs, const CandidateSet& set,
                            std::vector<int> selected, const ClusterView& cluster,
                            const PlannerOptions& options, Clock::time_point start,
                            bool optimal) {
  std::sort(selected.begin(), selected.end());
  PlanResult result;
  result.pruned = set.pruned;
  for (const Candidate& c : set.candidates) {
    if (c.mode != Mode::kWait) ++result.candidates;
  }
  result.objective =
      SelectionObjective(set, selected, static_cast<int>(jobs.size()), options);
  result.optimal = optimal;
  result.selected = selected;
  std::vector<int> gpus;
  for (int i : selected) {
    const Candidate& c = set.candidates[static_cast<size_t>(i)];
    Assignment a;
    a.mode = c.mode;
    for (int j : c.jobs) a.jobs.push_back(jobs[static_cast<size_t>(j)].id);
    a.gpus = c.gpus;
    a.predicted_jct_s = c.jct_s;
    a.tran_wt = c.tran_wt;
    gpus.push_back(c.gpus);
    result.assignments.push_back(std::move(a));
  }
  SLICESCHED_ASSIGN_OR_RETURN(auto placement, PackOntoNodes(gpus, cluster));
  for (size_t k = 0; k < placement.size(); ++k) {
    result.assignments[k].placement = std::move(placement[k]);
  }
  result.solve_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

// Checks that `selected` covers every job exactly once within capacity.
bool FeasibleSelection(const CandidateSet& set, const std::vector<int>& selected,
                       int num_jobs, int capacity) {
  std::vector<int> cover(static_cast<size_t>(num_jobs), 0);
  long used = 0;
  for (int i : selected) {
    const Candidate& c = set.candidates[static_cast<size_t>(i)];
    used += c.gpus;
    for (int j : c.jobs) ++cover[static_cast<size_t>(j)];
  }
  if (used > capacity) return false;
  return std::all_of(cover.begin(), cover.end(), [](int v) { return v == 1; });
}

struct CbcDeleter {
  void operator()(Cbc_Model* m) const { Cbc_deleteModel(m); }
};

}  // namespace

StatusOr<PlanResult> Plan(const std::vector<JobView>& jobs,
                          const std::vector<PairEstimate>& pairs,
                          const ClusterView& cluster, const PlannerOptions& options) {
  const auto start = Clock::now();
  SLICESCHED_ASSIGN_OR_RETURN(CandidateSet set,
                              GenerateCandidates(jobs, pairs, cluster, options));
  const int n = static_cast<int>(jobs.size());
  const int num_cands = static_cast<int>(set.candidates.size());
  if (n == 0) return Finish(jobs, set, {}, cluster, options, start, true);

  std::unique_ptr<Cbc_Model, CbcDeleter> model(Cbc_newModel());
  Cbc_Model* m = model.get();
  Cbc_setProblemName(m, "ymir");
  // Columns 0..num_cands-1: x_c; column num_cands: z.
  std::vector<std::vector<int>> by_job(static_cast<size_t>(n));
  for (int c = 0; c < num_cands; ++c) {
    const Candidate& cand = set.candidates[static_cast<size_t>(c)];
    std::string name = slicesched::StrCat("x", c);
    Cbc_addCol(m, name.c_str(), 0.0, 1.0, ColumnCost(cand, n, options), 1, 0, nullptr,
               nullptr);
    for (int j : cand.jobs) by_job[static_cast<size_t>(j)].push_back(c);
  }
  const int z_col = num_cands;
  Cbc_addCol(m, "z", 0.0, std::numeric_limits<double>::infinity(), 1.0, 0, 0, nullptr,
             nullptr);

  std::vector<int> cols;
  std::vector<double> coefs;
  for (int j = 0; j < n; ++j) {
    // Exactly one candidate (mode) per job.
    const auto& cs = by_job[static_cast<size_t>(j)];
    cols.assign(cs.begin(), cs.end());
    coefs.assign(cs.size(), 1.0);
    std::string name = slicesched::StrCat("one_", j);
    Cbc_addRow(m, name.c_str(), static_cast<int>(cols.size()), cols.data(), coefs.data(),
               'E', 1.0);
    // Max-slowdown linearisation.
    coefs.clear();
    for (int c : cs) {
      const Candidate& cand = set.candidates[static_cast<size_t>(c)];
      size_t k = cand.jobs[0] == j ? 0 : 1;
      coefs.push_back(cand.slowdown[k]);
    }
    cols.push_back(z_col);
    coefs.push_back(-1.0);
    name = slicesched::StrCat("max_", j);
    Cbc_addRow(m, name.c_str(), static_cast<int>(cols.size()), cols.data(), coefs.data(),
               'L', 0.0);
  }
  cols.clear();
  coefs.clear();
  for (int c = 0; c < num_cands; ++c) {
    int g = set.candidates[static_cast<size_t>(c)].gpus;
    if (g == 0) continue;
    cols.push_back(c);
    coefs.push_back(g);
  }
  if (!cols.empty()) {
    Cbc_addRow(m, "gpus", static_cast<int>(cols.size()), cols.data(), coefs.data(), 'L',
               cluster.gpus);
  }
  Cbc_setObjSense(m, 1.0);  // minimise

  // MIP start: everyone waits (always feasible).
  std::vector<int> start_idx;
  std::vector<double> start_val;
  double start_z = 0;
  for (int c = 0; c < num_cands; ++c) {
    const Candidate& cand = set.candidates[static_cast<size_t>(c)];
    start_idx.push_back(c);
    start_val.push_back(cand.mode == Mode::kWait ? 1.0 : 0.0);
    if (cand.mode == Mode::kWait) start_z = std::max(start_z, cand.slowdown[0]);
  }
  start_idx.push_back(z_col);
  start_val.push_back(start_z);
  Cbc_setMIPStartI(m, static_cast<int>(start_idx.size()), start_idx.data(),
                   start_val.data());

  Cbc_setLogLevel(m, 0);
  Cbc_setParameter(m, "logLevel", "0");
  Cbc_setParameter(m, "slogLevel", "0");
  Cbc_setParameter(m, "seconds", slicesched::StrCat(options.time_limit_s).c_str());
  Cbc_setParameter(m, "ratioGap", slicesched::StrCat(options.relative_gap).c_str());
  Cbc_setParameter(m, "allowableGap", "1e-9");
  Cbc_solve(m);

  const double* sol = Cbc_getColSolution(m);
  std::vector<int> selected;
  if (sol != nullptr) {
    for (int c = 0; c < num_cands; ++c) {
      if (sol[c] > 0.5) selected.push_back(c);
    }
  }
  bool optimal = Cbc_isProvenOptimal(m) != 0 && options.relative_gap == 0;
  if (!FeasibleSelection(set, selected, n, cluster.gpus)) {
    // No usable incumbent (should not happen with the MIP start): everyone waits.
    selected.clear();
    optimal = false;
    for (int c = 0; c < num_cands; ++c) {
      if (set.candidates[static_cast<size_t>(c)].mode == Mode::kWait) selected.push_back(c);
    }
  }
  return Finish(jobs, set, std::move(selected), cluster, options, start, optimal);
}

StatusOr<PlanResult> PlanExhaustive(const std::vector<JobView>& jobs,
                                    const std::vector<PairEstimate>& pairs,
                                    const ClusterView& cluster,
                                    const PlannerOptions& options) {
  const auto start = Clock::now();
  if (jobs.size() > 8) {
    return absl::InvalidArgumentError("PlanExhaustive handles at most 8 jobs");
  }
  SLICESCHED_ASSIGN_OR_RETURN(CandidateSet set,
                              GenerateCandidates(jobs, pairs, cluster, options));
  const int n = static_cast<int>(jobs.size());
  // Candidates grouped by their lowest job index.
  std::vector<std::vector<int>> by_first(static_cast<size_t>(n));
  for (int c = 0; c < static_cast<int>(set.candidates.size()); ++c) {
    const auto& js = set.candidates[static_cast<size_t>(c)].jobs;
    by_first[static_cast<size_t>(*std::min_element(js.begin(), js.end()))].push_back(c);
  }
  std::vector<bool> covered(static_cast<size_t>(n), false);
  std::vector<int> current, best;
  double best_obj = std::numeric_limits<double>::infinity();

  auto recurse = [&](auto&& self, int j, int used) -> void {
    while (j < n && covered[static_cast<size_t>(j)]) ++j;
    if (j == n) {
      double obj = SelectionObjective(set, current, n, options);
      if (obj < best_obj - 1e-12) {
        best_obj = obj;
        best = current;
      }
      return;
    }
    for (int c : by_first[static_cast<size_t>(j)]) {
      const Candidate& cand = set.candidates[static_cast<size_t>(c)];
      if (used + cand.gpus > cluster.gpus) continue;
      bool clash = false;
      for (int k : cand.jobs) clash |= covered[static_cast<size_t>(k)];
      if (clash) continue;
      for (int k : cand.jobs) covered[static_cast<size_t>(k)] = true;
      current.push_back(c);
      self(self, j + 1, used + cand.gpus);
      current.pop_back();
      for (int k : cand.jobs) covered[static_cast<size_t>(k)] = false;
    }
  };
  recurse(recurse, 0, 0);
  return Finish(jobs, set, std::move(best), cluster, options, start, true);
}

}  // namespace slicesched::ymir
