// `slicesim ymir`: a job-level, event-driven cluster simulator comparing the
// Ymir planner (../shared/papers/ymir.md; include/slicesched/ymir/planner.h)
// with classic deep-learning-training schedulers on the arrival, size and
// duration pattern of a real GPU-cluster job trace (the Pollux-derived Philly
// table, ../shared/traces/philly_jobs_pollux.csv).
//
// Mechanism and policy are kept apart: the simulator (RunYmirSim) owns the
// clock, job progress, transfer units, restarts, stop-loss and the capacity
// checks; a policy (YmirSimPolicy) only looks at a snapshot and returns how
// many GPUs each unit gets and which new transfer pairs to form.
//
// Every modelling assumption, in one place:
//
//  * Workload. LoadYmirJobs keeps the trace rows with duration >= 60 s and
//    gpu_time < 1000 GPU-hours (the Pollux authors' filter) and num_gpus <=
//    the cluster's GPUs, then takes `jobs` CONSECUTIVE rows (by submission)
//    starting at a seeded random offset, so the real arrival pattern (bursts,
//    day/night) is kept. Submission times are rebased to the window's first
//    job and divided by `load` (load 2 = arrivals compressed 2x).
//  * Task mix. Each job gets a task drawn uniformly (seeded) from the tasks of
//    the gains table. Task names are "<backbone>/<task>"; the backbone is the
//    part before '/'. The default table (DefaultYmirGains) has 3 backbones
//    (vit-base, roberta-base, vicuna-7b) x 9 tasks in 3 families of 3, like
//    the paper's 27 FMF tasks. All jobs allow sharing and share one trust
//    domain.
//  * Measured gains (--gains configs/ymir/gains_synth.csv): the estimators'
//    table (a speed-up minus 1, converted on load, see YmirGainsDefinition)
//    names 4 tasks without a backbone; the comparison replicates them onto
//    the 3 backbones of `backbones` (YmirGains::WithBackbones), so jobs draw
//    one of 12 tasks. A format-2 table is read from its steps-to-target gain
//    (gain_steps: a job's work is steps), not its area gain; the planner
//    sees the same value (configs/ymir/README.md, "Which gain each consumer
//    needs"). A censored row (the transfer run never reached the target:
//    its gain is only an upper bound) is never offered for transfer.
//  * Gains. DefaultYmirGains is a STAND-IN with the paper's reported
//    distribution (Sec. 2, Fig. 3/5: positive transfer for related tasks, up
//    to 2-2.3x fewer epochs, negative transfer for unrelated ones), NOT
//    measured: same-family temporal gains in [0.25, 0.60], spatial in
//    [0.20, 0.50]; cross-family temporal in [-0.30, 0.05], spatial in
//    [-0.35, 0.00]; each value fixed by a hash of the task names. It is to be
//    replaced by the table the estimators issue measures on the tiny task
//    family (load it with --gains FILE; CSV columns task_a, task_b, mode
//    (temporal|spatial), gain). A gain g means the target needs (1 - g) times
//    its iterations (temporal A->B: B's iterations; spatial: the pair's).
//    Pairs on different backbones, or absent from the table, never transfer.
//  * Estimation error. The planner sees the table gain; the gain realized in
//    the simulated run is  g + |g| * rel * z1 + abs * z2  (z1, z2 standard
//    normal, fixed per ordered pair and mode by the seed; rel = 0.16, about
//    the paper's 15.5-18% gain MAPE; abs = 0.05), capped at 0.95.
//  * Work and speed (the time-estimator LUT stand-in). All tasks share one
//    per-iteration time on 1 GPU (1 s), so "iterations" are 1-GPU seconds.
//    Throughput on g GPUs is the Amdahl-style speedup
//      S(g) = g / (1 + sigma (g - 1)),  sigma = 0.05
//    (S(2) = 1.90, S(4) = 3.48, S(8) = 5.93, S(16) = 9.14, S(32) = 12.5).
//    A job's total work is duration * S(num_gpus): on its trace GPU count it
//    runs exactly its trace duration.
//  * GPU counts. Non-elastic policies (Tiresias, Themis, SRTF) give a job its
//    trace count or nothing. Elastic ones (Ymir, Optimus, Pollux) choose from
//    {1, 2, 4, 8, ...} plus the trace count, up to max(gpus_per_node,
//    2 * num_gpus) and the cluster size.
//  * Restarts. Changing a running job's GPU count, or resuming a job that ran
//    before, stalls it for restart_s (default 30 s: the paper's "under a
//    minute" context switch). A job's first start is free (the trace duration
//    includes it), and so is the switch from A to B inside a temporal pair
//    (Ymir's tuner reuses the runtime).
//  * Transfer units. A temporal unit A -> B runs A on its GPUs, then B on the
//    same GPUs with (1 - realized) times its iterations; B must not have
//    started (it starts from A's weights), A may have progress. A spatial unit
//    trains A and B jointly: (1 - realized) * (W_A + W_B) * 1.05 iterations
//    (5% joint-step overhead), both finish together; neither may have
//    started. A unit is preempted and resized as a whole.
//  * Stop-loss (paper Sec. 4.3). Each job is taken to train for 10 epochs, so
//    one epoch is 10% of its iterations. If a unit's realized gain is
//    negative, the loss is noticed after 2 epochs of the transferring phase
//    (2 epochs of B for temporal, of A + B for spatial): that work is lost
//    and the job(s) continue alone with their full remaining iterations; they
//    are never paired again.
//  * Scheduling points. Every policy is invoked on arrivals, completions,
//    decouplings and every round_s (120 s) of simulated time; events at the
//    same instant are handled together.
//  * Nodes. After every decision the running units are packed onto nodes
//    with ymir::PackOntoNodes; the simulator fails (InternalError) if any
//    instant uses more GPUs than the cluster or a node has.
//
// Policies (MakeYmirSimPolicy names):
//   Ymir          the CBC joint ILP (ymir::Plan) with transfer; the ILP sees at
//                 most ilp_window units (default 32): half of them the units
//                 with the largest current slowdown (they most need GPUs), the
//                 other half the RUNNING units with the smallest slowdown (they
//                 can best give GPUs back; ilp_donors = false: the window is
//                 only the largest slowdowns, the original rule); the others
//                 keep their allocation. Each fresh job is offered its
//                 partners_per_job best predicted partners with a positive
//                 predicted gain. The planner runs with horizon_s = round_s
//                 (ymir_horizon_s; 0 = the original allocation-holds-to-the-end
//                 model) and each unit's fair-share speed as its reference
//                 speed: fair share = the cluster split evenly over the active
//                 units, capped at the unit's largest allowed count (with
//                 ymir_pair_shares, over the jobs, a pair holding two shares).
//                 The restart cost is explicit: JobView::current_gpus = the
//                 unit's GPUs, restart_s = restart_s for a unit that has run
//                 (so the ILP keeps an allocation unless a change gains more
//                 than the restart). The ILP is solved every round_s; at an
//                 arrival or completion between rounds only when GPUs are idle
//                 and some unit waits (otherwise the allocation stays until
//                 the next round). CBC stops at ilp_gap (1%) or
//                 ilp_time_limit_s (1 s).
//   Ymir-elastic  the same ILP with transfer off (no pair estimates): the
//                 paper's "Ymir degrades to an elastic scheduler" fallback.
//   Tiresias      2D-LAS: attained GPU-seconds in discretized priority queues
//                 (thresholds 3,600 and 36,000 GPU-s), FIFO inside a queue,
//                 non-elastic, preemptive, skip-ahead when a job does not fit.
//   Optimus       every job (FIFO) gets 1 GPU while any is free, then GPUs go
//                 one step at a time to the job whose remaining time drops the
//                 most per added GPU under S(g).
//   Pollux        goodput-adaptive: the same greedy, maximising the p = -1
//                 generalised mean (harmonic) of each job's speedup relative
//                 to its fair share, so small jobs grow first.
//   Themis        finish-time fairness: GPUs are leased for 600 s; running
//                 jobs keep them until their lease ends, then the jobs with the
//                 largest rho = (elapsed + remaining time on its GPUs) / trace
//                 duration get their trace GPU count first; non-elastic.
//   SRTF          preemptive shortest remaining time (on the trace GPU count)
//                 first; non-elastic, skip-ahead.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "slicesched/ymir/gains.h"
#include "slicesched/ymir/planner.h"

namespace slicesched {


struct YmirSimJob {
  double submit_s = 0;
  double duration_s = 0;  // on trace_gpus GPUs
  int trace_gpus = 1;
  std::string task;       // "<backbone>/<task>"
};

// Reads a job trace (workload::LoadJobTrace format), filters, samples a
// window of `jobs` consecutive jobs (all of them when fewer pass the filter)
// and assigns tasks from `gains` (see the header comment). `jobs` >= 1,
// `load` > 0 and `cluster_gpus` >= 1 are checked.
absl::StatusOr<std::vector<YmirSimJob>> LoadYmirJobs(const std::string& trace_path, int jobs,
                                                     double load, uint64_t seed, int cluster_gpus,
                                                     const ymir::YmirGains& gains);

struct YmirSimConfig {
  int gpus = 240;
  int gpus_per_node = 4;
  double round_s = 120;
  double restart_s = 30;
  double sigma = 0.05;             // speedup model
  double epochs = 10;              // per job, for the stop-loss window
  double stop_loss_epochs = 2;
  double spatial_overhead = 1.05;  // joint iteration cost factor
  double gain_noise_rel = 0.16;
  double gain_noise_abs = 0.05;
  uint64_t seed = 1;
  // Ymir planner.
  int ilp_window = 32;
  int partners_per_job = 4;
  double ilp_time_limit_s = 1;
  double ilp_gap = 0.01;  // PlannerOptions::relative_gap
  double lambda = 1.0;
  // PlannerOptions::horizon_s: < 0 = round_s (the default); 0 = the original
  // model (an allocation is assumed to hold until the job finishes).
  double ymir_horizon_s = -1;
  // The ILP window: false = the ilp_window units with the largest slowdown;
  // true = half of them plus the running units with the smallest slowdown.
  bool ilp_donors = true;
  // Fair shares per job, a transfer unit holding its members' shares (true),
  // or per unit (false).
  bool ymir_pair_shares = false;
};

double YmirSpeedup(const YmirSimConfig& config, double gpus);

// --- The policy interface ---------------------------------------------------

enum class YmirUnitMode { kSingle, kTemporal, kSpatial };

// A schedulable unit: one job, or a transfer pair bound together.
struct YmirUnitView {
  uint64_t uid = 0;              // stable while the unit exists
  YmirUnitMode mode = YmirUnitMode::kSingle;
  std::vector<int> jobs;         // job indices; temporal: {source, target}
  int gpus = 0;                  // current allocation (0 = waiting)
  double held_since_s = 0;       // when the current allocation began (running units)
  bool ran = false;              // has held GPUs before: resuming or resizing costs a restart
  double submit_s = 0;           // earliest member submission
  double remaining_work = 0;     // 1-GPU seconds left in the whole unit (policy view)
  double total_work = 0;         // of all members, from the trace
  double attained_gpu_s = 0;     // GPU-seconds received so far
  int trace_gpus = 1;            // max over members
  std::vector<int> allowed_gpus; // elastic choices, ascending (includes trace_gpus)
  bool fresh = false;            // single job that never ran: may pair either way
  bool pairable = false;         // single job never tried in a transfer unit
  std::string task;              // single units only
};

struct YmirSimState {
  double now = 0;
  bool round = false;                  // a round_s boundary (else an arrival/completion)
  const YmirSimConfig* config = nullptr;
  const ymir::YmirGains* gains = nullptr;    // predicted gains (the estimator)
  std::vector<YmirUnitView> units;     // active (submitted, unfinished)
};

struct YmirSimDecision {
  // Per units[i]: GPUs from now on (0 = wait). Ignored for units in `pairs`.
  std::vector<int> gpus;
  struct Pair {
    int source = 0;  // index into units (temporal: A; spatial: either)
    int target = 0;  // temporal: B
    ymir::Mode mode = ymir::Mode::kTemporal;
    int gpus = 1;
  };
  std::vector<Pair> pairs;
  double solve_s = -1;  // ILP time when the policy solved one
};

class YmirSimPolicy {
 public:
  virtual ~YmirSimPolicy() = default;
  virtual std::string Name() const = 0;
  virtual absl::StatusOr<YmirSimDecision> Decide(const YmirSimState& state) = 0;
};

// "Ymir", "Ymir-elastic", "Tiresias", "Optimus", "Pollux", "Themis", "SRTF".
absl::StatusOr<std::unique_ptr<YmirSimPolicy>> MakeYmirSimPolicy(const std::string& name);
std::vector<std::string> YmirSimPolicyNames();

// --- Running ----------------------------------------------------------------

struct YmirJobOutcome {
  double finish_s = 0;
  double jct_s = 0;
  ymir::Mode transfer = ymir::Mode::kNormal;  // kTemporal / kSpatial when it ran in a pair
  bool decoupled = false;                     // stop-loss split its pair
  int final_gpus = 0;                         // GPUs of its unit when it finished
};

struct YmirSimResult {
  std::string policy;
  std::vector<YmirJobOutcome> jobs;  // in input order
  double avg_jct_s = 0, p99_jct_s = 0, makespan_s = 0;
  double transfer_share = 0;  // jobs that ran in a temporal or spatial unit
  int temporal_jobs = 0, spatial_jobs = 0, decoupled_jobs = 0;
  int decisions = 0, restarts = 0;
  int peak_gpus = 0;          // most GPUs in use at any instant
  int ilp_calls = 0;
  double ilp_avg_s = 0, ilp_max_s = 0;
  // Every decision (time, uid -> gpus, pairs formed), for comparing policies.
  std::vector<std::string> log;
  std::string ToJson() const;
};

// Runs the jobs (any order; submit_s >= 0) to completion under `policy`.
absl::StatusOr<YmirSimResult> RunYmirSim(const std::vector<YmirSimJob>& jobs, const ymir::YmirGains& gains,
                                         const YmirSimConfig& config, YmirSimPolicy& policy);

// `slicesim ymir`.
struct YmirCompareOptions {
  std::string trace;       // empty: <shared_dir>/traces/philly_jobs_pollux.csv
  std::string shared_dir;  // empty: ../shared next to the source tree
  std::string gains;       // empty: ymir::DefaultYmirGains()
  // "" (the file's directive, else saved), "saved" or "speedup".
  std::string gains_definition;
  // "" (gain_steps when the file has it, else gain), "gain" or "gain_steps"
  // (YmirGainsLoadOptions::column).
  std::string gains_column;
  // A loaded table whose tasks name no backbone is replicated onto these
  // (YmirGains::WithBackbones), like the paper's 3 backbones x 9 tasks.
  std::vector<std::string> backbones = {"vit-base", "roberta-base", "vicuna-7b"};
  std::string policy = "all";
  int jobs = 2000;
  double load = 1;
  int nodes = 60;
  YmirSimConfig config;
  // InvalidArgument naming the option (as slicesim's flag) and its value:
  // jobs, nodes and config.gpus >= 1 with gpus a multiple of nodes, load,
  // config.round_s and config.ilp_time_limit_s > 0, config.restart_s and
  // config.ilp_gap >= 0, config.ilp_window >= 1, policy, gains_definition
  // and gains_column one of their names. RunYmirCompare checks it first.
  absl::Status Validate() const;
};

struct YmirCompareResult {
  std::string trace, gains;
  ymir::YmirGainsSource gains_source;  // of the table the policies ran with
  int jobs = 0;
  std::vector<YmirSimResult> policies;
  std::string ToJson(const YmirCompareOptions& options) const;
  std::string ToText() const;
};

absl::StatusOr<YmirCompareResult> RunYmirCompare(const YmirCompareOptions& options);

}  // namespace slicesched
