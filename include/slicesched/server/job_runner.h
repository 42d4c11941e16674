// The fine-tuning job runner of the `sliced` daemon: the Ymir planner loop
// over the JobManager's jobs and the execution of the jobs it runs as
// low-priority "<deployment>/train" graph instances through the master's
// operator-level scheduler (Ymir's runtime, spatial pairs included).
//
// Tick() is one non-blocking pass; the daemon calls it from its own thread
// (Start), tests call it directly with an injected clock. A pass:
//
//   1. Arrivals and profiling. A job in `submitted` goes to `profiling`
//      (StartProfiling on devices {0 .. min_gpus-1}): its data is loaded and
//      kProfileMicroBatches (3) real training micro-batches run, one at a
//      time, through Master::SubmitTrainStep on those devices, on a scratch
//      copy of the job's fresh TaskState (the job's own training starts
//      from its initialisation, or its temporal source's adapters, when it
//      first runs). The first micro-batch is a warm-up; the mean of the
//      others (submit to end, so it includes waiting behind other work) x
//      grad_accumulation is the job's measured seconds per iteration. It is
//      recorded in a "progress" event of the profiling job (details
//      "profiled_iter_time_s", "profile_micro_batches"), then the job is
//      queued (Queue, with the epoch / iteration limit of the loaded data as
//      iterations_target) and the planner sees it with that time. A failing
//      profile fails the job with the reason. A job left `profiling` by a
//      restart is back in `submitted` (JobManager) and is profiled again.
//      A queued job, a completion or a decoupling makes the next pass plan;
//      such a requested round waits while any job is still profiling (at
//      most until the planner.interval round is due), so jobs submitted
//      together are planned together. With planner.time_lut and
//      planner.profile_from_lut, a job whose LUT key (DpLutKey at gpus.min)
//      the LUT holds as measured (not interpolated) runs no profiling
//      micro-batch: its data is loaded, its time is the LUT's, and the event
//      says "profile_from_lut": 1, "profile_micro_batches": 0.
//   2. Planning, every planner.interval of the injected clock and on
//      arrivals / completions: one ymir::JobView per queued, paused or
//      running job (below), ymir::Plan on the cluster's devices, and the
//      decisions applied as JobManager transitions:
//        kNormal / kSpatial        -> Run (alone / spatial with the partner)
//        kTemporal A -> B          -> Run(A, temporal, partner B); B stays
//                                     queued and starts from A's trained
//                                     adapters (TransferLora) when it first
//                                     runs after A completed
//        kWait for a running job   -> Preempt (its checkpoint is written
//                                     once the micro-batch in flight ends)
//      A running job whose plan is unchanged is not re-run (no event). The
//      event log gets mode, partner, predicted gain (the planner's TranWt - 1
//      of the pair) and the devices. Devices: the plan's GPU counts are
//      given concrete device ids, buddy-aligned blocks first (a 2-GPU job
//      gets {0,1} or {2,3}), so a pp2 partition fits inside the set.
//      planner.mode = elastic gives the planner no pair estimates: the same
//      ILP as a plain elastic scheduler (no transfer).
//   3. Execution. An iteration is grad_accumulation micro-batches of
//      batch_size rows (one optimizer step: AdamW, or SGD with momentum for
//      hyperparameters.optimizer: sgd); each micro-batch is a
//      Master::SubmitTrainStep in the offline class, so online serving keeps
//      priority, bounded to devices of the job's plan
//      (InstanceSpec::allowed_devices), so the planner's GPU set bounds where
//      the operator-level scheduler places the job's operators. A job alone
//      (or in a temporal pair) uses data parallelism
//      (server/job_runner_dp.h): a plan of g devices runs m = g /
//      pipeline_parallel streams; an iteration runs as waves of up to m
//      concurrent micro-batches of that iteration (never of the next: its
//      forwards read the stepped adapters), stream i on its own device
//      group (devices [i*pp, (i+1)*pp) of the plan; a wave of one
//      micro-batch uses the whole plan set). Each carries its micro_index;
//      the optimizer operator folds the gradients into the job's TaskState
//      in micro_index order (executor/kernels/llama_kernels.h), so the state is
//      bit-identical to one sequential stream whatever order they finish
//      in. The next wave is submitted when the whole wave ended. The two
//      jobs of a spatial pair instead share ONE stream of joint
//      micro-batches on the pair's whole device set, one in flight at a
//      time, without data parallelism (see "What is executed for pairs"
//      below). A failed micro-batch fails the job (a joint one: both jobs)
//      with the operator's message (once its wave ended).
//   4. Evaluation and stop. At every multiple of eval_every_steps
//      iterations (0: at each epoch end) and at the limit, the job's metric
//      is computed (a point passed while the job was paused is evaluated on
//      the same state when it runs again) on its held-out split (the
//      last min(128, n/5) examples) with the operators called directly on
//      the resident backbone: accuracy = argmax of the task head at the
//      labelled positions, loss = mean cross-entropy, perplexity = exp(loss).
//      The job completes when the metric meets stop.target; when the epoch
//      or iteration limit comes first it completes with metrics["censored"]
//      = 1 (recorded, the target was not reached).
//   5. Checkpoints: every planner.checkpoint_interval and whenever the job
//      leaves running (preempt, pause, shutdown), the whole TaskState
//      (adapters, optimizer moments, step count, accumulated gradients) goes to
//      STATE_DIR/jobs/<id>/checkpoint.safetensors (written to a temporary
//      file and renamed), then ReportProgress records it. A job that runs
//      again after a restart (JobManager requeues it with its
//      checkpoint_path) loads it: the data position follows from the step
//      count, so it resumes exactly where the checkpoint was taken.
//   6. Runtime reuse. The backbone is the deployment's resident weights,
//      shared by every job and never unloaded; a paused job keeps its loaded
//      data and its TaskState in memory. Data of queued / paused jobs is
//      prepared once the next planning round is within planner.prefetch.
//      Every (re)start measures its context switch, split into
//      load_checkpoint_ms, prepare_data_ms (0 when prefetched; the prefetch's
//      own time is reported beside it as prefetched_data_ms, outside the
//      total) and first_step_ms (submit of the first micro-batch to its end),
//      summed as context_switch_ms, reported in the job's next progress
//      event. A job whose state and data stayed in memory (preempted or
//      paused, not restarted) reports no load or preparation part.
//
// JobView from the job's state: remaining_iterations = the iteration limit
// (max_epochs x iterations per epoch, capped by max_iterations) minus
// iterations_done; iter_time_s[min_gpus] = the measured seconds per
// iteration of this job on one stream (profiling, then an EMA over its
// micro-batches that ran as a wave of one, a spatial pair's joint
// micro-batches included, x grad_accumulation; else of any job on the
// same deployment, else default_iter_time_s); the larger counts that need
// fewer waves per iteration, up to gpus.max and the cluster
// (DpOfferedGpuCounts), are offered with DpIterTimes: the job's measured
// iterations on that count, else scaled by the time LUT
// (planner.time_lut), else ESTIMATED as micro-batch time x ceil(GA / m)
// plus a sync cost per extra concurrent stream (measured from this
// deployment's waves, else 10% of a micro-batch); every other count is 0
// (not allowed). Every measured time here is a span timed through
// JobRunnerOptions::span_seconds. Measured iterations (a whole iteration
// on one device count, never a joint one) go back into the LUT by
// TimeLut::Update (EWMA), written to the LUT's file after each planning
// round and at Stop (a missing file starts empty). The LUT key has no sequence length or backbone: one LUT is
// assumed to describe the daemon's jobs; fair_share_jct_s = remaining x
// time x max(1, demand / devices); waited_s from the submission time to
// now, both on the JobManager's clock (JobManager::NowUnixMs);
// has_progress once a step ran. Tasks for the gains table are the
// synthetic or WordNet task names (file datasets: the job name), as `slicesim
// ymir-estimators --gains-out` writes them (configs/ymir/gains_synth.csv);
// the planner pairs only jobs on the same backbone, and only while the
// listed jobs' gpus.min exceed the devices (with one to spare, each job
// alone finishes sooner). The table is read by
// LoadYmirGains, which converts the estimators' speedup gains (a
// "# gain-definition: speedup" line) into the planner's saved fraction of
// iterations (from a format-2 table's steps-to-target gain, gain_steps);
// the runner uses that fraction as is.
//
// Stop-loss (ymir/stop_loss.h, ../shared/papers/ymir.md §4.3): every pairing
// is watched by a ymir::StopLoss (window 2 epochs, min_improvement 0). The
// members: both jobs of a spatial pair; the target B of a temporal pair A ->
// B, which, once A completed, runs as Run(B, temporal, partner A) (the
// JobManager allows a completed source as a temporal partner) from A's
// adapters. When a member starts running in the pairing, its metric is
// evaluated on its state at that moment (its step then is its pairing start;
// for B: A's transferred adapters at step 0). The reference each later
// evaluation is compared with:
//   * a member of a spatial pair or the target of a temporal pair, when this
//     runner has a measured normal run of the same task: the job's expected
//     normal curve, i.e. the evaluations of another job that trained
//     normally (alone from a fresh state, never a transfer target, never
//     joint) with the same deployment, task, data size, metric, learning
//     rate, batch size, grad_accumulation and LoRA rank/alpha (seeds may
//     differ; the longest such run): its metric at the member's step (a
//     spatial member starts fresh, a temporal target from its source's
//     adapters with its own step count 0, so the member's step is its own
//     steps of training), linearly interpolated between its evaluations,
//     and beyond its last evaluation the iteration estimator's
//     extrapolation (ymir/iteration_estimator.h FitLossCurve of the run's
//     points) for a loss or perplexity metric. A temporal target that
//     starts better than a fresh job (its source's adapters) but then
//     improves slower than normal training is caught this way. The normal
//     runs' evaluations are stored (JobManager::RecordNormalEvaluation,
//     the state database's normal_runs, schema 4) and read back at Create,
//     so a restarted runner keeps its curves; a job resumed from a
//     checkpoint extends its stored run, and one without a stored run
//     (its earlier training is unknown: it may have been paired) starts
//     none;
//   * otherwise (no such run; accuracy past the run's last evaluation) the
//     fallback of the policy: the metric the job had when the pairing began
//     must have improved by the end of the window. (The 3 profiling
//     micro-batches are no normal curve: single micro-batch losses of a
//     fresh head vary by 2x, e.g. 1.25, 0.65, 1.19.)
// Every later evaluation of a member is observed with epochs = (step - start
// step) / iterations per epoch; the metric is passed sign-flipped for
// higher-is-better metrics (accuracy), so the policy's lower-is-better
// comparison means "better than the reference". The evaluation's progress
// event carries "stop_loss_reference" (in the metric's own sign),
// "stop_loss_start_metric" (the member's metric at the pairing's start),
// "stop_loss_normal_curve" (1: from the curve, 0: the fallback) and, with a
// curve, "stop_loss_normal_run_job" (the job whose normal run it is); a
// decoupling's reason names the reference too ("reference: the normal run
// of job N at step S" / "reference: its metric at the pairing's start, step
// S").
// On kDecouple the runner calls JobManager::Decouple(member, "stop-loss:
// ...") (event "decoupled" with the reason; a spatial partner is decoupled in
// the same transaction, reason "partner job N was decoupled: stop-loss:
// ..."); the jobs keep their TaskState and step count and continue as normal
// jobs, and the pair is never offered to the planner again: the decoupling
// is stored with never_pair_again (the state database's decoupled_pairs, in
// the decoupling's transaction) and a new runner reads those pairs at
// Create, so a restart does not pair them again either. On kKeep the
// evaluation's progress event carries "stop_loss_kept": 1 and the pairing
// continues unwatched. A pairing that stops running (re-plan, pause,
// preemption, completion) drops its watch; if it runs again, the window
// starts again.
//
// What is executed for pairs: temporal pairs as described (A, then B from
// A's adapters). A spatial pair A + B (A the smaller id) trains jointly
// (train_ops.h, "Spatial joint training"): one shared LoRA adapter, a head
// per job, each job its own optimizer state, as one micro-batch stream of
// low-priority "<deployment>/train" instances with two task slots (T = 2;
// llama_kernels.h) on the pair's devices:
//   * Start: before the pair's first micro-batch both jobs must be fresh (no
//     step, nothing accumulated: the planner pairs only jobs without
//     progress; the runner checks), on one deployment with one LoRA config;
//     then ShareLora gives B A's initial adapter (B's head stays its own).
//     Otherwise the pair is decoupled (reason "spatial joint training not
//     possible: ...") and each job runs alone; the split is stored with
//     never_pair_again like a stop-loss decoupling, so a restarted runner
//     does not plan and split the same pair again.
//   * A joint micro-batch mixes the next micro-batch of each job that still
//     accumulates this iteration (rows of A, then rows of B, left-padded to
//     the longer row; row_task = slot), so each job consumes its own data
//     in its own order exactly as alone, and its micro-batch index stays
//     step x grad_accumulation + accumulated. Every row carries its
//     leading pad count (TrainBatch::row_pad, in a job's own micro-batch
//     too): the operators mask pad keys, start each row's RoPE positions at
//     its first real token and ignore labels at pad positions
//     (train_ops.h "Padding"), so when the two jobs' rows differ in length
//     each row still computes what it computes in its job's own micro-batch
//     (up to float rounding). The kernels accumulate each
//     job's gradient (of its own rows' loss) into its own TaskState and take
//     one JointOptimizerStep when both have their grad_accumulation micro-batches:
//     both step counts advance together. It is submitted in the pass of B,
//     once A's pass has processed the previous step (and its evaluation).
//   * No data parallelism for joint steps: the pair runs ONE stream, one
//     joint micro-batch in flight at a time (a wave of one, no micro_index:
//     the kernels reject a joint request carrying one) on the pair's whole
//     device set. The planner knows it (PairEstimate::spatial_single_stream):
//     it offers a spatial pair only the larger of the two gpus.min and
//     prices its joint iterations from the members' one-stream times (their
//     times at gpus.min), never from data-parallel times t(g) the joint
//     stream would not reach.
//   * Evaluation, completion and checkpoints stay per job (each with its own
//     head and TaskState). Progress, loss and iteration times are per job
//     (stats().steps_done counts a joint micro-batch once per member whose
//     rows it carries: a member that completed its iteration's micro-batches
//     and waits for its partner's is not counted); a
//     joint micro-batch's time is the one-stream micro-batch time of each
//     member whose rows it carries (not of a member waiting for its
//     partner's) but never a measurement of a GPU count (time LUT,
//     measured_iter_s).
//   * Decoupling (stop-loss, a re-plan, a partner pausing, completing,
//     failing or being cancelled: the JobManager decouples both) stops the
//     joint steps; each job continues alone (data-parallel again) from
//     exactly its own TaskState, which is at every instant an independent
//     task (its copy of the shared adapter, its head, its moments and step
//     count). A job that holds a complete iteration then (it finished its
//     grad_accumulation micro-batches while the partner, with a larger
//     grad_accumulation, was still accumulating: the joint step waited)
//     first takes that optimizer step alone, then continues with the next
//     iteration; so does one resumed from a checkpoint taken in that state.
//   * Persistence and restarts. The pair's first joint micro-batch records
//     it (JobManager::StartJointTraining: event "joint_training", the state
//     database's joint_pairs, schema 5) until it is decoupled. While it
//     trains jointly both members' JobViews name each other
//     (ymir::JobView::joint_partner), so the planner may keep it spatial
//     despite its progress. After a restart both come back queued with the
//     pair still stored; the next planning round loads both checkpoints
//     (JointPartners): at the same step with bit-identical LoRA factors
//     (one shared adapter) the pair is offered as spatial again and, when
//     planned so, resumes joint training without ShareLora (event
//     "joint_training", "resumed": true; each member's accumulated
//     micro-batches are its own). Otherwise (different steps or adapters, a
//     member gone, both fresh, a checkpoint that does not load, or the
//     planner running a member without its partner) the stored pair is
//     removed with event "joint_not_resumed" and the reason on both jobs,
//     and each member resumes alone from its own checkpoint. A member that
//     is still queued, paused or running but beyond the round's list (a
//     round lists one page of jobs, 1,000) is not gone: the pair stays
//     stored and is not offered that round.
//
// Backbone: a job's `backbone` names a deployment, or a preset; a preset
// runs on the first deployment of that preset (offline role preferred).
//
// Threading: Tick and the accessors are called from one thread at a time
// (the runner thread, or the test); Master and JobManager are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "slicesched/common/clock.h"
#include "slicesched/jobs/job_manager.h"
#include "slicesched/server/config.h"
#include "slicesched/server/extensions.h"
#include "slicesched/server/master.h"

namespace slicesched {
namespace ymir {
struct JobView;       // ymir/planner.h
struct PairEstimate;  // ymir/planner.h
struct PlanResult;    // ymir/planner.h
}  // namespace ymir

namespace synth {
class WordNetCorpus;  // synth/wordnet.h
}  // namespace synth
namespace executor {
struct TaskState;   // executor/train/train_ops.h
struct TrainBatch;  // executor/train/train_ops.h
}  // namespace executor

struct JobRunnerStats {
  uint64_t plans = 0;          // planning rounds solved
  uint64_t steps_done = 0;     // micro-batches finished per job (not counting profiling; a joint
                               // micro-batch once per member whose rows it carries)
  uint64_t profile_steps = 0;  // profiling micro-batches finished
  uint64_t steps_failed = 0;
  double last_solve_s = 0;
};

class JobRunner final : public TrainingRunner {
 public:
  // Loads the gains table (planner.gains) when set; fails naming the file.
  static absl::StatusOr<std::unique_ptr<JobRunner>> Create(Master* master, jobs::JobManager* jobs,
                                                          JobRunnerOptions options);
  ~JobRunner() override;
  JobRunner(const JobRunner&) = delete;
  JobRunner& operator=(const JobRunner&) = delete;

  // One pass (see the header comment). Errors of one job fail that job; the
  // returned status is about the runner itself (store errors).
  absl::Status Tick();
  // Blocks until a micro-batch of some running job ends or `timeout` passes
  // (a condition wait on the instance record, not a sleep).
  void WaitForProgress(absl::Duration timeout);
  // Makes the next Tick plan regardless of the interval.
  void RequestPlan() { plan_requested_ = true; }

  // Runs Tick on a thread until Stop.
  void Start() override;
  // Stops the thread (if any), waits up to `timeout` for in-flight
  // micro-batches and checkpoints every running job. Idempotent.
  void Stop(absl::Duration timeout) override;
  using TrainingRunner::Stop;

  JobRunnerStats stats() const { return stats_; }
  // Test hooks: the job's optimizer step count and accumulated micro-batches
  // as the runner holds them (-1, -1 when it holds no runtime for the job).
  std::pair<int64_t, int64_t> TrainingPosition(uint64_t job_id) const;
  // Test hook: a copy of the job's TaskState as the runner holds it (the
  // state its micro-batches train); false when it holds none.
  bool CopyTaskState(uint64_t job_id, executor::TaskState* out) const;
  // Test hook: micro-batch k of the job's data (its own rows, as a plain
  // step or its part of a joint step trains them); false when the runner
  // holds no loaded data for the job.
  bool MicroBatchOf(uint64_t job_id, int64_t k, executor::TrainBatch* out);
  // Test hook: how many measured micro-batch times went into the job's
  // one-stream time (its planner iteration time; profiling not counted);
  // -1 when the runner holds no runtime for the job.
  int64_t OneStreamSamples(uint64_t job_id) const;

  struct Runtime;  // one job's data, training state and step in flight (job_runner.cc)

 private:
  struct Gains;
  struct DpState;  // the time LUT, measured sync costs (job_runner.cc)
  struct PairWatch;  // the stop-loss of one spatial pairing (job_runner.cc)
  JobRunner(Master* master, jobs::JobManager* jobs, JobRunnerOptions options);

  Runtime& RuntimeFor(const jobs::JobInfo& info);
  // One profiling pass of a job (see 1. above); failures fail the job.
  void Profile(Runtime& rt, const jobs::JobInfo& info);
  // The stop-loss of a spatial pairing: its start metric, its evaluations.
  absl::Status StartPairWatch(Runtime& rt, const jobs::JobInfo& info);
  void ObservePairing(Runtime& rt, const jobs::JobInfo& info, double metric, std::map<std::string, double>* extra);

  absl::Status Admit();
  absl::Status PlanRound(Timestamp now);
  // PlanRound's phases (job_runner_plan.cc).
  struct PlanInputs;      // the planner's job views and each job's task
  struct PairCandidates;  // the transfer candidates, by ordered pair
  PlanInputs JobViews(const std::vector<jobs::JobInfo>& listed, int devices);
  PairCandidates PairCandidatesOf(const PlanInputs& in);
  std::map<size_t, std::vector<uint32_t>> PlaceOnDevices(const ymir::PlanResult& plan, int devices) const;
  void PreemptWaiting(const ymir::PlanResult& plan);
  absl::Status ApplyAssignments(const ymir::PlanResult& plan, const std::map<size_t, std::vector<uint32_t>>& devs_of,
                                const std::map<std::pair<uint64_t, uint64_t>, ymir::PairEstimate>& by_pair,
                                Timestamp now);
  void DropEndedPairWatches();
  void Prefetch(Timestamp now);
  absl::Status Drive(Timestamp now);
  // Drive's phases for one job (job_runner_drive.cc). kEnd: the job's pass
  // ends there, and Drive goes on with the next job.
  enum class JobPass { kContinue, kEnd };
  // Its profiling pass; `*info` as it is afterwards.
  absl::StatusOr<JobPass> DriveProfiling(Runtime& rt, jobs::JobInfo* info);
  // The end of the wave in flight: a failed micro-batch fails the job; else
  // its time, its loss and an evaluation point it reached are recorded.
  JobPass FinishWave(Runtime& rt, const jobs::JobInfo& info);
  // The context switch of a (re)start, once its first micro-batch ended.
  void ReportContextSwitch(Runtime& rt, const jobs::JobInfo& info, double first_step_ms);
  // The marked evaluation point: the job completes (target or limit reached)
  // or reports the metric.
  absl::StatusOr<JobPass> EvaluatePending(Runtime& rt, const jobs::JobInfo& info);
  absl::Status CheckpointIfDue(Runtime& rt, const jobs::JobInfo& info, Timestamp now);
  // Prepares a running job and submits its next wave (a spatial pair: its
  // joint micro-batch); failures of the job fail it.
  absl::Status StartNextMicroBatch(Runtime& rt, const jobs::JobInfo& info, Timestamp now);
  absl::Status ApplyPlan(uint64_t id, const jobs::RunPlan& plan, Timestamp now);
  // Loads the deployment and data of a job and, with `with_state`, its
  // training state (checkpoint, temporal source or fresh). Idempotent.
  absl::Status Prepare(Runtime& rt, const jobs::JobInfo& info, bool with_state);
  absl::Status Checkpoint(Runtime& rt, const std::map<std::string, double>& extra);
  absl::Status Evaluate(Runtime& rt, double* metric, double* loss);
  // Data parallelism (job_runner_dp.h; see 3. and "JobView" above).
  absl::Status LoadTimeLut();
  void SaveTimeLut();
  // Profiling from the time LUT: true when it handled the job (queued it,
  // or failed it when its data does not load).
  bool ProfileFromLut(Runtime& rt, const jobs::JobInfo& info);
  void OfferIterTimes(Runtime& rt, double min_time_s, int devices, ymir::JobView* v);
  // Submits the next wave, micro-batches k, k+1, ..; records them in rt.
  absl::Status SubmitWave(Runtime& rt, int64_t k);
  // `ms` as measured (the wave's submit to its end).
  void RecordWave(Runtime& rt, double ms);
  // A timed span of the job's training through options_.span_seconds.
  double SpanSeconds(const Runtime& rt, int64_t waves, double elapsed_s) const;
  void FailJob(uint64_t id, const std::string& reason);
  std::string DeploymentFor(const jobs::JobSpec& spec, absl::Status* error);
  // The corpus of a `wordnet` dataset (wordnet_), loaded on first use.
  absl::StatusOr<std::shared_ptr<const synth::WordNetCorpus>> WordNetCorpusFor(const std::string& dir, int64_t vocab);

  // Spatial joint training (job_runner.cc, "Spatial joint training").
  // The micro-batch of a running spatial pair: submitted in the pass of the
  // member with the larger id, once both are ready; the pairing starts with
  // ShareLora (both fresh, else decoupled). Errors of one job fail the jobs.
  absl::Status DriveSpatial(Runtime& rt, const jobs::JobInfo& info);
  // Decouples a spatial pair that cannot train jointly (JobManager::Decouple
  // with never_pair_again: never re-paired, by this runner or after a
  // restart).
  void DecoupleSpatial(uint64_t a, uint64_t b, const std::string& reason);
  // The stop-loss reference of an evaluation of a pairing member (a spatial
  // member or a temporal target) at its optimizer step `step`
  // (lower-is-better, like `start`, the metric at the pairing's start): the
  // expected normal metric from a measured normal run of the same task where
  // one exists, else `start`. `*curve_job` is the normal run's job (0: the
  // fallback `start`).
  double StopLossReference(const Runtime& rt, double start, int64_t step, uint64_t* curve_job) const;
  // Every evaluation of a job that trains normally (alone from a fresh
  // state, never the target of a transfer, never joint) joins its run.
  // The points go to the state store too (JobManager::RecordNormalEvaluation)
  // and Create reads them back, so the curves survive a restart.
  void RecordEvaluation(const Runtime& rt, const jobs::JobInfo& info, int64_t step, double metric);
  // The job trained jointly or from another job's adapters: its evaluations
  // are no normal run (forgotten here and in the store).
  void NotANormalRun(uint64_t id);
  struct NormalRun {
    std::string key;  // the task and training setup (NormalRunKey in job_runner.cc)
    bool normal = true;
    std::vector<std::pair<int64_t, double>> points;  // (step, metric), increasing steps
  };
  std::set<std::pair<uint64_t, uint64_t>> joint_started_;  // ShareLora done (key as pair_watch_)
  // Per listed job, the job it trains jointly with or may resume joint
  // training with (ymir::JobView::joint_partner): pairs training jointly
  // now, and stored joint pairs whose members are both queued or paused with
  // consistent checkpoints (the same step, one shared adapter), or were
  // planned spatial together by an earlier round (DriveSpatial resumes such a
  // stored pair once both members' states are loaded). A stored
  // pair that cannot resume is removed (JobManager::EndJointTraining, event
  // "joint_not_resumed" with the reason) and its members resume alone.
  std::map<uint64_t, uint64_t> JointPartners(const std::vector<jobs::JobInfo>& listed);
  std::map<uint64_t, NormalRun> normal_runs_;              // per job

  Master* const master_;
  jobs::JobManager* const jobs_;
  const JobRunnerOptions options_;
  SteadyClock own_clock_;
  const Clock* clock_;
  std::unique_ptr<Gains> gains_;
  std::unique_ptr<DpState> dp_;
  std::map<uint64_t, std::unique_ptr<Runtime>> runtimes_;
  std::map<uint64_t, uint64_t> temporal_source_;  // target job -> source job
  // WordNet corpora of `wordnet` datasets, by (directory, vocabulary): read
  // once (117k synsets), shared by every job on them.
  std::map<std::pair<std::string, int64_t>, std::shared_ptr<const synth::WordNetCorpus>> wordnet_;
  // Keyed by (smaller id, larger id).
  std::map<std::pair<uint64_t, uint64_t>, std::unique_ptr<PairWatch>> pair_watch_;
  std::set<std::pair<uint64_t, uint64_t>> decoupled_pairs_;  // never re-paired
  bool plan_requested_ = true;
  Timestamp last_plan_ = Timestamp::Never();
  JobRunnerStats stats_;

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace slicesched
