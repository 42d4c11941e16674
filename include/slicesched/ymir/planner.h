// YmirSched-style joint planner: transfer-mode selection (normal / temporal /
// spatial), job pairing and GPU allocation solved together as one ILP on
// COIN-OR CBC (see ../shared/papers/ymir.md, "联合 ILP").
//
// Model, per scheduling round:
//
//  * Per-iteration time. JobView::iter_time_s is a lookup table indexed by GPU
//    count: iter_time_s[g] is the seconds per iteration on g GPUs; an entry of
//    0 (or an index past the end) means "g GPUs is not allowed". Only counts
//    in [min_gpus, max_gpus] are considered.
//
//  * Candidates (c), each holding `gpus` GPUs for the whole round:
//      wait      job j, 0 GPUs. Always present so the ILP is always feasible.
//                Predicted JCT = round_s + the slowest allowed normal JCT
//                (or round_s + fair_share_jct_s when no GPU count is
//                allowed), so waiting is never better than running.
//      normal    job j alone on g GPUs: JCT_j = R_j * t_j(g).
//      temporal  A -> B on g GPUs (same g for both phases): A runs first, then
//                B starts from A's trained parameters and needs only
//                (1 - temporal_gain_ab) * R_B iterations:
//                  JCT_A = R_A t_A(g),  JCT_B = JCT_A + (1 - gain) R_B t_B(g).
//      spatial   A + B trained jointly on g GPUs (only if neither job has
//                progress). The joint run needs (1 - spatial_gain)(R_A + R_B)
//                joint iterations, each taking
//                spatial_iter_time_factor * max(t_A(g), t_B(g)) seconds; both
//                jobs finish together: JCT_A = JCT_B = that product. A pair
//                whose joint iterations run as ONE stream
//                (PairEstimate::spatial_single_stream) does not get faster
//                with g: it is offered only g = max(min_gpus_A, min_gpus_B)
//                and each joint iteration takes spatial_iter_time_factor *
//                max(t_A(min_gpus_A), t_B(min_gpus_B)) (the one-stream
//                times), so it is never priced as if data parallelism sped
//                it up, nor given devices it would leave idle.
//    where R is remaining_iterations and g ranges over the GPU counts allowed
//    for both jobs of a pair.
//
//  * Pair eligibility: same backbone, both allow_sharing, same trust_domain
//    (the tenant alone does not matter); a temporal A -> B needs
//    !has_progress on B (it starts from A's parameters); spatial needs
//    !has_progress on both jobs, or the two jobs naming each other as
//    joint_partner (a pair already training jointly: kept, or resumed after
//    a restart). Estimates naming unknown jobs, a job with
//    itself, or an ineligible pair are ignored.
//
//  * TranWt of a pair candidate on g GPUs = (sum of the two JCTs when both run
//    independently, one after the other, on those g GPUs under SRTF) /
//    (sum of the two JCTs of the candidate). With T_A = R_A t_A(g),
//    T_B = R_B t_B(g), s = min(T_A, T_B), l = max(T_A, T_B):
//      SRTF sum = s + (s + l) = 2s + l.
//    TranWt > 1 means the transfer finishes the pair faster on average.
//    Pair candidates with TranWt < min_tran_wt (1 by default) are pruned
//    before the ILP. Wait / normal candidates have TranWt = 1.
//
//  * Slowdown of job j under candidate c:
//      S_jc = (waited_s_j + JCT_jc) / fair_share_jct_s_j.
//
//  * ILP (x_c binary, z continuous):
//      minimise   z + (alpha / n) * sum_j sum_{c ∋ j} S_jc x_c
//                   - lambda * sum_c (TranWt_c - 1) x_c
//      s.t.       sum_{c ∋ j} x_c = 1                  for every job j
//                 sum_c gpus_c x_c <= cluster.gpus
//                 sum_{c ∋ j} S_jc x_c - z <= 0        for every job j
//    The max-slowdown term z (min-max, linearised with the auxiliary z and one
//    row per job) keeps the slowdowns close by pulling the worst one down,
//    i.e. GPUs go first to the jobs with the largest slowdown; the mean term
//    breaks ties among the other jobs (every running option beats waiting);
//    lambda rewards transfer candidates by their JCT gain over SRTF.
//    A pair candidate covers both of its jobs, so each job is in at most one
//    pair and has exactly one mode.
//
//  * Horizon (PlannerOptions::horizon_s > 0; opt-in, 0 = the model above).
//    The planner is re-run every round, so an allocation really holds for one
//    round, not until the job finishes. Comparing "this job gets one more
//    GPU until it finishes" (a benefit over its whole remaining time) with
//    "that job waits one round" (a loss of round_s) over different horizons
//    makes the ILP grow running jobs instead of admitting waiting ones. With
//    a horizon H every candidate is predicted over the same horizon: its
//    allocation for H seconds, then the job's reference speed
//    (JobView::reference_iter_time_s, its fair-share speed from the LUT):
//      normal   JCT = time to finish the remaining iterations when the first
//               H seconds run at t(g) and the rest at t_ref;
//      wait     JCT = H + restart_s + R * t_ref (no progress for H);
//      temporal A's iterations then (1 - gain) R_B, back to back, at t(g)
//               until H and at the pair's reference afterwards; spatial: the
//               joint iterations likewise. After the horizon a pair keeps
//               both members' fair shares: its reference iteration time is
//               1 / (1 / t_ref_A + 1 / t_ref_B) (times the spatial factor).
//    A job that finishes within H is unaffected. TranWt stays as defined
//    above (on g GPUs until both finish, no horizon, no restart): it measures
//    the transfer, not the allocation.
//
//  * Reconfiguration cost (JobView::current_gpus, JobView::restart_s; 0 by
//    default). A candidate that runs a job on a GPU count other than
//    current_gpus (a resize, or resuming a preempted job) adds restart_s to
//    its predicted JCT before any progress (for a pair: the source's stall
//    for temporal, the larger of the two for spatial); the wait candidate
//    adds it too when the job will have to restart to resume. This makes
//    allocations sticky: a running job is resized only when the predicted
//    slowdown gain beats the restart it costs.
//
//  * After solving, running assignments are packed onto nodes first-fit
//    decreasing by GPU count so each spans as few nodes as possible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "slicesched/common/status.h"

namespace slicesched::ymir {

struct JobView {
  uint64_t id = 0;
  std::string backbone;
  std::string tenant;
  std::string trust_domain;
  bool allow_sharing = true;
  // True once the job has trained (its weights diverged from the backbone):
  // it can no longer be merged spatially.
  bool has_progress = false;
  // The job it is training jointly with (a spatial pair whose members hold
  // one shared adapter at the same step; 0: none). Such a pair may stay, or
  // resume, spatial despite its progress: both members must name each other.
  uint64_t joint_partner = 0;
  int min_gpus = 1;
  int max_gpus = 1;
  double remaining_iterations = 0;
  // iter_time_s[g]: seconds per iteration on g GPUs; 0 = g not allowed.
  std::vector<double> iter_time_s;
  // JCT the job would have with its fair share of the cluster (> 0).
  double fair_share_jct_s = 1;
  // Time already spent in the system (queueing + running) so far.
  double waited_s = 0;
  // --- Optional (defaults reproduce the original model) ---
  // Seconds per iteration the job is expected to get after the planning
  // horizon (PlannerOptions::horizon_s), typically its fair-share speed from
  // the LUT. 0: the candidate's own speed (the allocation is assumed to hold
  // until the job finishes).
  double reference_iter_time_s = 0;
  // GPUs the job holds now (0: not running).
  int current_gpus = 0;
  // Reconfiguration cost: seconds of stall the job pays when it runs on a GPU
  // count other than current_gpus (a resize, or resuming after a preemption).
  // 0 for a job that never ran (its first start is part of its JCT already).
  // It is added to the predicted JCT of every candidate that changes the
  // job's count, and to its wait candidate when current_gpus == 0 (it will
  // have to restart when it resumes).
  double restart_s = 0;
};

// Transfer estimates for a pair of jobs. Gains are fractions of iterations
// saved (0.3 = 30% fewer iterations; negative = negative transfer):
//   temporal_gain_ab: B (b) needs (1 - gain) * R_B iterations when it starts
//                     from A's (a's) trained parameters. Directed: give a
//                     second estimate with a and b swapped for B -> A.
//   spatial_gain:     joint training needs (1 - gain) * (R_A + R_B) joint
//                     iterations. Symmetric; when both (a,b) and (b,a) are
//                     given, the gains and factors are averaged.
//   spatial_iter_time_factor: one joint iteration on g GPUs takes this factor
//                     times max(t_A(g), t_B(g)) seconds (>= 1 typically).
//   spatial_single_stream: the joint iterations run as one stream (no data
//                     parallelism): the spatial candidate is offered at the
//                     smallest GPU count both jobs allow only, priced from
//                     the members' one-stream times (see "spatial" above).
//                     Either of (a,b), (b,a) setting it sets it for the pair.
struct PairEstimate {
  uint64_t a = 0;
  uint64_t b = 0;
  double temporal_gain_ab = 0;
  double spatial_gain = 0;
  double spatial_iter_time_factor = 1;
  bool spatial_single_stream = false;
};

struct ClusterView {
  int gpus = 0;
  int gpus_per_node = 1;
};

struct PlannerOptions {
  double lambda = 1.0;         // weight of the transfer bonus (TranWt - 1)
  double alpha = 1.0;          // weight of the mean slowdown
  double round_s = 120.0;      // scheduling period, used for the wait option
  double min_tran_wt = 1.0;    // pair candidates below this are pruned
  double time_limit_s = 30.0;  // CBC "seconds" limit
  // CBC "ratioGap": stop once the incumbent is proven within this relative
  // gap of the best bound (0 = prove optimality; PlanResult::optimal is then
  // false when the solver stopped at a non-zero gap).
  double relative_gap = 0.0;
  // Planning horizon (see "Horizon" in the header comment). 0: every
  // allocation is assumed to hold until the job finishes (the original
  // model). > 0: an allocation holds for horizon_s seconds, after which the
  // job continues at JobView::reference_iter_time_s; the wait candidate then
  // predicts horizon_s of no progress followed by the reference speed.
  double horizon_s = 0.0;
};

enum class Mode { kWait, kNormal, kTemporal, kSpatial };
const char* ModeName(Mode mode);

// One ILP column.
struct Candidate {
  Mode mode = Mode::kWait;
  // Indices into the jobs vector: one entry (wait, normal) or two (temporal:
  // {source A, target B}; spatial: {a, b}).
  std::vector<int> jobs;
  int gpus = 0;
  std::vector<double> jct_s;     // predicted JCT per member of `jobs`
  std::vector<double> slowdown;  // S_jc per member of `jobs`
  double tran_wt = 1.0;
};

struct CandidateSet {
  std::vector<Candidate> candidates;  // includes one wait candidate per job
  int pruned = 0;                     // pair candidates with TranWt < min
};

// Validates the inputs and builds every candidate (see the header comment).
StatusOr<CandidateSet> GenerateCandidates(const std::vector<JobView>& jobs,
                                          const std::vector<PairEstimate>& pairs,
                                          const ClusterView& cluster,
                                          const PlannerOptions& options = {});

// The ILP objective (minimised) of a selection: `selected` indexes `set`.
double SelectionObjective(const CandidateSet& set, const std::vector<int>& selected,
                          int num_jobs, const PlannerOptions& options);

struct NodeSlice {
  int node = 0;
  int gpus = 0;
};

struct Assignment {
  Mode mode = Mode::kWait;
  std::vector<uint64_t> jobs;   // job ids, in Candidate::jobs order
  int gpus = 0;                 // 0 for kWait
  std::vector<NodeSlice> placement;
  std::vector<double> predicted_jct_s;
  double tran_wt = 1.0;
};

struct PlanResult {
  // Every job appears in exactly one assignment (possibly kWait).
  std::vector<Assignment> assignments;
  double solve_seconds = 0;  // candidate generation + model build + solve
  int candidates = 0;        // non-wait candidates given to the solver
  int pruned = 0;            // pair candidates pruned for TranWt < min
  double objective = 0;      // SelectionObjective of the chosen set
  bool optimal = false;      // proven optimal (false on time limit)
  std::vector<int> selected;  // indices into GenerateCandidates' output
};

// Packs running jobs (GPU counts, in input order) onto nodes of
// cluster.gpus_per_node GPUs, first-fit decreasing: larger jobs first; a job
// goes to the first node with enough free GPUs, else it takes whole free
// the nodes with the most free GPUs first so it spans as few nodes as possible.
// Requires sum(gpus) <= cluster.gpus.
StatusOr<std::vector<std::vector<NodeSlice>>> PackOntoNodes(
    const std::vector<int>& gpus, const ClusterView& cluster);

// Solves the joint ILP with CBC.
StatusOr<PlanResult> Plan(const std::vector<JobView>& jobs,
                          const std::vector<PairEstimate>& pairs,
                          const ClusterView& cluster,
                          const PlannerOptions& options = {});

// Same objective and constraints, by enumerating every selection. For tests;
// at most 8 jobs.
StatusOr<PlanResult> PlanExhaustive(const std::vector<JobView>& jobs,
                                    const std::vector<PairEstimate>& pairs,
                                    const ClusterView& cluster,
                                    const PlannerOptions& options = {});

}  // namespace slicesched::ymir
