// Ymir's transfer-gain estimator (../shared/papers/ymir.md §4.1),
// reproduced on the synthetic task family of
// slicesched/synth/tasks.h and the LoRA training operators of train_ops.h:
// Task2Vec task embeddings, directed and symmetric similarities, and a linear
// regression from similarity to a transfer gain that is MEASURED by training.
//
// Probe and embedding (Task2Vec, Achille et al. 2019, adapted to PETL). Every
// task starts from the same probe: LoRA factors from one seed on the shared
// backbone and a head from the same seed (or, with zero_head, an all-zero
// head; see YmirExperimentOptions for the head and the learning-rate warm-up). The probe is trained on the task for `probe_steps`
// AdamW steps (the start of the task's normal run), then the task's embedding
// is the diagonal of the empirical Fisher information of the LoRA parameters,
//   F_T = mean over `fisher_examples` training examples (x, y) of
//         (d loss(x, y) / d theta)^2,  theta = every LoRA factor,
// from per-example gradients (the head is left out: its shape depends on the
// task's number of classes; Task2Vec likewise embeds only the feature
// extractor). The labels are the true ones (empirical Fisher) by default;
// YmirFisher::kModel takes Task2Vec's expectation over the probe's own
// predictive distribution instead, and YmirEmbedParams::kLoraHead appends the
// head's Fisher per hidden unit (the backbone's layer norms are frozen, not
// parameters of train_ops.h, so they cannot be embedded).
//
// That is YmirProbe::kTrained. With YmirProbe::kHead (slicesim --probe head,
// the default) the probe is Task2Vec's own: the LoRA factors stay at their
// shared init and only the head is trained, so the embedding is a property of
// the task and the data, not of a point on the task's (noisy) training
// trajectory: the similarities of the same pairs on seeds 1 and 2 correlate
// r = 0.89 with it and r = 0.17 without (seeds 1 and 3: 0.86 and 0.81); the
// regression scored no better with it on a held-out seed of the first setup
// (docs/design/ymir-estimators.md). On the graded family (zero head, 40
// probe steps, 256 Fisher examples) it is the setting
// to use: r 0.86-0.94 across seeds against 0.29-0.48, the identical-rule
// pairs the most similar on every seed, and a lower MAPE on all three seeds.
//
// Distances, as in Task2Vec: the symmetric distance normalises element-wise
// by the pair,  d_sym(a, b) = d_cos(F_a / (F_a + F_b), F_b / (F_a + F_b)),
// and the asymmetric one subtracts the source's distance from the trivial
// embedding t0 (here: the Fisher of the same probe trained on `lm`, the
// backbone's own pretraining task), d_asym(a -> b) = d_sym(a, b) -
// alpha d_sym(a, t0). Ymir's similarities: temporal (A then B, directed)
// S(A, B) = 1 - d_asym(A -> B); spatial (A and B jointly) the mean of
// S(A, B) and S(B, A).
//
// Measured gain. Each task's normal run trains from the probe init for
// `normal_steps` steps; its eval-loss curve (every `eval_every` steps on
// held-out examples) defines the target: the loss at which it has achieved
// `target_fraction` of its loss reduction, L0 - f (L0 - min L). Steps(run) is
// where its eval loss first reaches the target, interpolated linearly
// between the eval points around the crossing (`max_steps + 1` when it never
// does: censored). Temporal A -> B: B's probe init with A's
// trained LoRA (TransferLora after A's normal run); spatial A + B: both from
// the probe init with one shared LoRA (ShareLora, AccumulateJointMicroBatch,
// JointOptimizerStep with `spatial_rule`), each step a batch of each task. A run stops when its
// target(s) are reached or after max_steps = max_steps_factor x normal_steps.
//   gain(B | mode, A) = Steps(normal B) / Steps(transfer B) - 1
// (> 0: B reaches normal training's target sooner; < 0: later). A spatial run
// gives two gains, B's (row A,B) and A's (row B,A).
//
// With YmirGainMeasure::kArea (slicesim --gain area) the gain is formed from
// the whole window of W steps instead (see the enum below).
//
// Evaluation schedule: normal runs every step up to the longest prefix of
// the iteration estimator (below), then every `eval_every` steps; transfer
// runs every `eval_every` steps. Steps to target, targets and the
// early stop use only the grid points (step 0 and multiples of eval_every),
// so the extra prefix evaluations change no measurement; they feed the
// iteration estimator (and the stop-loss's reference curves).
//
// Stopping rules (slicesched/ymir/stopping.h): the target is fixed by the
// normal run (ymir::NormalTarget) and shared by every run of the task;
// steps are ymir::StepsToTarget, censored at max_steps + 1.
//
// Iteration estimator (slicesched/ymir/iteration_estimator.h). Each task's
// normal run is predicted from its PREFIX: the eval points at steps 0..P,
// P = max(3, round(iter_prefix_fraction x normal_steps)) (32 of 80 steps by
// default; normal runs are evaluated every step up to the longest prefix,
// and the errors are also reported for the prefixes of iter_prefix_sweep),
// fitted by ymir::FitLossCurve with `iter_fit` (by default the transient
// rule on, b2 = 0 and recency weights, see iteration_estimator.h); the
// prediction is the fitted curve's steps to the task's target. Transfer
// runs of B are predicted from B's normal prefix with the curve adjusted by
// the LEAVE-ONE-OUT predicted gain of the pair (LossCurve::WithGain; gains
// below -0.9 are clamped to -0.9), i.e. predicted(B | A) = predicted(B) /
// (1 + predicted gain). Errors |pred - meas| / meas are averaged over the
// tasks (normal) and over the uncensored pairs (transfer); a prediction
// whose fitted curve never reaches the target counts as max_steps + 1.
// Online (iter_online, the default): the
// headline prediction is ymir::EstimateOnline on the normal run's
// evaluations (to normal_steps) with the first window P: a window that is a
// plateau is not fitted, the window grows until the curve has left the
// plateau and the part after the drop is fitted (iter_plateau); a task whose
// plateau outlasts the run has no estimate and counts as max_steps + 1. The
// report says which steps it saw: the mean and max of the step at which each
// estimate became available (observed_steps_mean / _max; P for a task
// without a plateau), and the fixed-prefix figure at P is reported beside it
// (YmirEstimatorReport::iteration_first_window).
// Watched transfer runs (iter_transfer_watch, the default): the headline
// transfer prediction of a pair is made once its run
// has run `watch` steps, by ymir::EstimateTransferOnline against the curve
// of B's headline normal estimate (the prior above where the watch places
// nothing), its speed-up shrunk toward the predicted gain's; the prior's
// errors are reported beside it, and the same estimate for other watches in
// transfer_watch_sweep. A prediction beyond max_steps (normal or transfer)
// is scored as censored, max_steps + 1, as a fit that never reaches the
// target is.
//
// Stop-loss (slicesched/ymir/stop_loss.h) on every transfer run: an "epoch"
// here is `stop_loss_epoch_steps` steps (the normal run, 80 steps of 16, is
// about one real epoch of the 1,024 training examples, so the 2-epoch window
// is scaled down to 2 x 4 = 8 steps by default); the reference of an
// evaluation at step s is the task's own normal eval curve at s (linear
// between its eval points). Temporal: the verdict is recorded (decoupling
// does not change B's training: B keeps its adapters and optimizer state).
// Spatial: when the policy decouples at step s, the joint run goes on (its
// steps still define the spatial gain) and, in addition, copies of both
// TaskStates continue ALONE with AdamWStep from step s; their steps to
// target are the pair's steps with stop-loss. A run that reaches its target
// before the window ends is kept.
//
// Regression and scores. Per mode, gain ~ w0 + w1 S by least squares, plus
// w2 (S(A, B) - S(B, A)) with direction = kAsymmetry (the default); the
// reported predictions are leave-one-out (each pair's
// gain predicted by the fit on the other pairs of its mode), or, with
// fit_on, the model fitted on training seeds' pairs: either way the scores
// are out of sample.
// Classification accuracy: predicted and measured gain on the same side of 0,
// over all pairs and over the non-neutral ones (|measured gain| >= the
// neutral band of NeutralBand, from `null_runs` null runs per task: a pair
// whose gain training noise alone would show has no measurable sign).
// MAPE is over the speedup 1 + gain (the gain itself crosses 0, where a
// relative error is undefined): mean |pred - meas| / (1 + meas).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "slicesched/common/stats.h"  // LinearFit, FitLine and FitLeastSquares of the gain model
#include "slicesched/executor/llama/llama_ops.h"
#include "slicesched/executor/train/train_ops.h"
#include "slicesched/synth/tasks.h"
#include "slicesched/synth/wordnet.h"
#include "slicesched/ymir/iteration_estimator.h"

namespace slicesched::executor {

// Where the Task2Vec embedding is taken (YmirExperimentOptions::probe).
enum class YmirProbe : uint8_t {
  // The state of the task's own normal run after probe_steps (LoRA and head
  // trained together): the embedding depends on that training trajectory.
  kTrained,
  // Task2Vec's probe network: the LoRA factors stay at their (shared) init,
  // only the head is trained for probe_steps on the task, then the Fisher of
  // the LoRA factors is taken there. The trivial embedding (`lm`) uses the
  // backbone's own pretrained lm head, untrained further. Coordinates whose
  // Fisher is zero in every embedding (the A factors: B = 0 at init, so
  // their gradient is exactly 0) are dropped before the distances.
  kHead,
};

// Which Fisher forms the embedding (YmirExperimentOptions::fisher).
enum class YmirFisher : uint8_t {
  // The empirical Fisher: squared gradients of the loss at the TRUE label.
  kEmpirical,
  // Task2Vec's Fisher: the expectation over the probe's own predictive
  // distribution, sum_c p(c | x) g_c(x)^2, with g_c the gradient of the loss
  // at label c and p(c | x) = exp(-loss_c) (renormalised over the classes);
  // C gradient passes per example. The trivial `lm` embedding stays
  // empirical (its labels are next tokens over the whole vocabulary).
  kModel,
};

// Which parameters' Fisher forms the embedding (YmirExperimentOptions::embed).
enum class YmirEmbedParams : uint8_t {
  kLora,  // every LoRA factor (the head's shape depends on the task's classes)
  // The LoRA factors, then the head's Fisher summed over its outputs, one
  // coordinate per hidden unit (so that tasks with different numbers of
  // classes, and the vocab-sized `lm` head, embed in the same space).
  kLoraHead,
};

// How two embeddings are compared (YmirExperimentOptions::distance).
enum class YmirDistance : uint8_t {
  // Task2Vec: cosine distance of F_a / (F_a + F_b) and F_b / (F_a + F_b).
  kNormalised,
  // Plain cosine distance of F_a and F_b (no element-wise normalisation).
  kCosine,
};

// How the measured gain is formed (YmirExperimentOptions::gain_measure).
enum class YmirGainMeasure : uint8_t {
  // Steps(normal B) / Steps(transfer B) - 1, each the first crossing of the
  // target (see above): one crossing of a wandering curve.
  kSteps,
  // Area-equivalent speed-up over a fixed budget of W = gain_window steps:
  // the s for which the mean eval loss of the transfer run over its grid
  // points t_k in (0, W] equals the mean of the normal curve at s t_k,
  //   mean_k N(s t_k) = mean_k T(t_k),   gain = s - 1,
  // with N the isotonic (non-increasing) regression of B's normal eval curve
  // (its grid points, averaged over repeats; normal runs are continued to
  // max_steps for this, beyond the normal_steps that define the target and
  // the temporal source) and T averaged over repeats. Under the iteration
  // estimator's model (a transfer rescales time, LossCurve::WithGain) this is
  // the same gain as the steps definition, but it uses every evaluation of
  // the window instead of one crossing. s is clamped to [0.1, max_steps / W]
  // (YmirPair::gain_clamped). Transfer runs train at least W steps.
  kArea,
};

// The regressors of the gain model (slicesim --direction). Task2Vec's
// similarity is almost symmetric (S(A, B) - S(B, A) = alpha (d(A, trivial)
// - d(B, trivial)), the complexity term), while transfer is not (the
// source that sits on a plateau, first-class, is the most negative level as a
// source and positive as a target: docs/design/ymir-estimators.md).
enum class YmirDirection : uint8_t {
  kNone,       // gain ~ w0 + w1 S (Ymir's)
  kAsymmetry,  // gain ~ w0 + w1 S + w2 (S(A, B) - S(B, A)), YmirPair::asymmetry
};

// One row of a training seed's pairs (YmirEstimatorReport::PairsCsv), for a
// gain model fitted on other seeds than the one it is judged on.
struct YmirTrainingPair {
  std::string task_a, task_b;
  std::string mode;  // "temporal" or "spatial"
  double similarity = 0;
  double asymmetry = 0;
  double gain = 0;
};
// Whether the pair (a, b) involves a task of `holdout` (by base name: NAME@K
// is NAME).
bool InvolvesHeldOutTask(const std::vector<std::string>& holdout, std::string_view a, std::string_view b);
// Parses PairsCsv's text: the header line, then task_a, task_b, mode,
// similarity, asymmetry, gain per line. InvalidArgument naming the line and
// field that is wrong.
absl::StatusOr<std::vector<YmirTrainingPair>> ParseYmirPairsCsv(const std::string& text);

// The area-equivalent speed-up above: `reference` is the normal curve (any
// points, sorted by step; made non-increasing here), `steps` the transfer
// run's evaluation steps in the window and `transfer_mean` its mean loss
// there. Bisection on log s in [min_speedup, max_speedup]; *clamped (may be
// null) is set when the answer is a bound.
double AreaEquivalentSpeedup(const std::vector<ymir::LossPoint>& reference,
                             const std::vector<double>& steps, double transfer_mean,
                             double min_speedup, double max_speedup, bool* clamped);

// The neutral band of the measured gains (docs/design/ymir-estimators.md):
// `band_k` times the root mean square of the NULL gains, each the
// gain measured for a task's own normal run redone on another seed's
// training sentences and init (YmirExperimentOptions::null_runs), i.e. the
// gain a pair shows from the normal runs' seed-to-seed noise alone. 0 when
// there are no null gains.
double NeutralBand(const std::vector<double>& null_gains, double band_k);

// Sign agreement of predicted and measured gains, over all pairs and over the
// non-neutral ones (|measured| >= band; a pair inside the band is "neutral":
// its sign is not measurable, it is counted apart; pairs beyond the shorter
// vector are not scored). Majority: always
// predicting the more common measured sign (of the pairs scored).
struct SignScore {
  int64_t pairs = 0;
  int64_t positive = 0;
  int64_t agree = 0;
  int64_t neutral = 0;
  int64_t non_neutral_positive = 0;
  int64_t non_neutral_agree = 0;
  // Three classes, the interval rule of the ground truth: a prediction is
  // positive at >= band, negative at <= -band, neutral between; it agrees
  // when the measured gain falls in the same class. Majority: always
  // predicting the most common measured class.
  int64_t three_way_agree = 0;
  double AccuracyPct() const;
  double ThreeWayAccuracyPct() const;
  double ThreeWayMajorityPct() const;
  double MajorityPct() const;
  double NonNeutralAccuracyPct() const;  // 0 when every pair is neutral
  double NonNeutralMajorityPct() const;
};
SignScore ScoreSigns(const std::vector<double>& predicted, const std::vector<double>& measured,
                     double band);

struct YmirTaskSpec {
  std::string name;  // a classification task of synth::KnownTasks() (or synth::WordNetTasks())
  int64_t num_classes = 2;
};

struct YmirExperimentOptions {
  // The defaults are the graded family with a negative level
  // (docs/design/ymir-estimators.md): four tasks of C = 4
  // classes at length 16 over a 32-token language, label margin 1, a zero
  // head with a 4-step warm-up, 80 normal steps, the sum rule for spatial
  // steps, the area gain over the whole normal run (W = 80), and Task2Vec's
  // head probe with 256 Fisher examples. Its levels: fa-bins <-> fa-bins@1
  // identical rule (positive), fa-bins / fa-bins@1 <-> fb-bins disjoint
  // (neutral), first-class -> the count tasks attention conflict (negative;
  // the other direction is positive, synth/tasks.h). The first
  // setup (fa-major, fa-inv, fb-major, fab-major,
  // last-class:4 at length 8 over 256 tokens, random head, 40 steps; its
  // gains: configs/ymir/gains_first_setup.csv) is all flags: --tasks
  // fa-major,fa-inv,fb-major,fab-major,last-class:4 --language-vocab 256
  // --sequence-length 8 --label-margin 0 --eval-examples 64 --warmup-steps 0
  // --head random --steps 40 --probe-steps 20 --spatial-step mean --gain
  // steps --probe trained --fisher-examples 64. With zero_head, fa-inv is
  // the mirror image of fa-major (the same eval curve to the last digit).
  std::vector<YmirTaskSpec> tasks = {{"fa-bins", 4}, {"fa-bins@1", 4}, {"fb-bins", 4}, {"first-class", 4}};
  uint64_t seed = 1;  // data (train: seed, eval: seed + 1) and the probe init
  int64_t sequence_length = 16;
  int64_t label_margin = 1;  // synth::DatasetOptions::margin of every task's data
  int64_t batch_size = 16;
  int64_t train_examples = 1024;
  int64_t eval_examples = 128;
  int64_t lora_rank = 8;
  double lora_alpha = 8.0;
  double learning_rate = 1e-2;
  // Fine-tuning schedule: the learning rate rises linearly over the first
  // lr_warmup_steps optimizer steps of every run, lr (k + 1) / W at the
  // state's step k < W, then stays at learning_rate. It counts the
  // TaskState's own steps, so a temporal B (TransferLora restarts its
  // optimizer) warms up again; 0 = constant lr.
  int64_t lr_warmup_steps = 4;
  // Head initialisation of every probe: false = train_ops.h's seeded
  // N(0, 1/hidden) head; true = an all-zero head (the probe starts at the
  // uniform prediction, eval loss ln C, and the head grows along the
  // features instead of the LoRA chasing a random head). The LoRA init is
  // the same either way. A temporal B gets a fresh head of the same kind
  // (the head is never transferred: B's label space is its own).
  bool zero_head = true;
  // How a spatial pair's joint step combines the two tasks' AdamW steps of
  // the shared adapter (train_ops.h, JointStepRule): kMean halves each
  // task's own step (a pair can then at best match a task alone: the spatial
  // gains come out almost all negative); kSum applies both tasks' full steps
  // (multi-task training on the summed loss, one optimizer per task).
  JointStepRule spatial_rule = JointStepRule::kSum;
  int64_t normal_steps = 80;
  int64_t max_steps_factor = 2;
  int64_t eval_every = 4;
  double target_fraction = 0.9;
  int64_t probe_steps = 40;  // <= normal_steps
  // kHead makes the similarities reproducible across seeds (r 0.86-0.94 on
  // the graded family against 0.29-0.48 for kTrained); on
  // the first setup's family it did not score better on a held-out seed
  // (docs/design/ymir-estimators.md).
  YmirProbe probe = YmirProbe::kHead;
  YmirGainMeasure gain_measure = YmirGainMeasure::kArea;
  // The gain model's regressors (YmirDirection; kNone is Ymir's) and what
  // it is fitted on: with fit_on empty, per mode on this
  // run's other pairs (leave-one-out, as above); otherwise on these rows of
  // training seeds (slicesim --fit-on FILE,...; PairsCsv of earlier runs), so
  // every prediction of this run is out of sample and no pair is left out.
  YmirDirection direction = YmirDirection::kAsymmetry;
  std::vector<YmirTrainingPair> fit_on;
  // Held-out tasks (slicesim --holdout-tasks): the gain model is fitted only
  // on pairs (fit_on's or this run's) that involve none of them, and scored
  // only on pairs that involve one, so every scored prediction concerns a
  // task the model never saw. A task is matched by its base name: holding
  // out animal-plant holds out animal-plant@1 too (the same rule on other
  // examples would leak it). Empty: every pair is scored (leave-one-out or
  // fit_on, above). Each must name a task of `tasks`.
  std::vector<std::string> holdout_tasks;
  // W of kArea, a multiple of eval_every; 0 = normal_steps (the whole normal
  // run). The whole run rather than its first half (normal_steps / 2)
  // lowers the neutral band (seed 1: 0.93 -> 0.34, seed 2: 0.50 -> 0.41,
  // docs/design/ymir-estimators.md) at the same cost.
  int64_t gain_window = 0;
  int64_t GainWindow() const { return gain_window > 0 ? gain_window : normal_steps; }
  int64_t fisher_examples = 256;
  YmirFisher fisher = YmirFisher::kEmpirical;
  YmirEmbedParams embed = YmirEmbedParams::kLora;
  YmirDistance distance = YmirDistance::kNormalised;
  // Null runs per task (see NeutralBand): each task's normal run again on
  // the training sentences and from the probe init of seed + 7919 u (u =
  // 1..null_runs), evaluated on the task's own eval set and measured like a
  // transfer run of that task; band_k x their RMS gain is the neutral band.
  // 0 = no band (every pair is scored by its sign). They also run with
  // curves_only (the band is a property of the normal runs).
  int64_t null_runs = 2;
  double band_k = 2.0;
  double alpha = 0.15;  // Task2Vec's asymmetry weight
  // Measurement repeats: every run again with seed + 1000 r (data and init);
  // steps are averaged over repeats before the gain is formed. The
  // embeddings come from repeat 0.
  int64_t repeats = 1;
  double iter_prefix_fraction = 0.4;  // of normal_steps, see above: the headline prefix
  std::vector<double> iter_prefix_sweep = {0.2, 0.6};  // also reported
  // See above (the defaults: transient rule, b2 = 0, recency weights with a
  // half-life of 12 steps; --iter-time-shift on fits a time origin, for
  // curves that start flat). The half-life (slicesim --iter-half-life, 0 =
  // equal weights): the zero head and the learning-rate warm-up keep a
  // normal run near its start for 10-20 steps, and the running-minimum
  // envelope of that noisy flat start is a slow staircase that an
  // equal-weight fit reads as an early, slow decay (predictions too late;
  // docs/design/ymir-estimators.md); weighting the end of the
  // prefix discounts it. 12 was chosen on seed 1 (8-16 are within 1 point
  // there); it is in steps of this experiment's schedule, not a library
  // default (ymir::FitOptions keeps equal weights).
  ymir::FitOptions iter_fit = {.recency_half_life = 12};
  // The online estimate through a plateau (above; slicesim --iter-online
  // on|off): off makes the fixed prefix P the headline again.
  bool iter_online = true;
  ymir::PlateauOptions iter_plateau;
  // The transfer runs' online refinement (ymir::EstimateTransferOnline;
  // slicesim --iter-transfer-watch K, 0 = off): once a transferred run of B
  // has run `watch` steps (ymir::TransferWatchOptions' default, 16, a fifth
  // of the normal run), its losses are matched against the curve of B's headline
  // normal estimate; the headline transfer figures are then these
  // estimates, and the prior (B's normal estimate / (1 + the predicted
  // gain), available at step 0) is reported beside them. watch must be 0 or
  // >= eval_every (a transfer run's first evaluation after step 0).
  // The watched speed-up is shrunk toward the predicted gain, which counts as
  // prior_points = 4 watched points (slicesim --iter-transfer-prior-points;
  // at the default watch of 16 steps, evaluated every 4, the geometric mean
  // of the two; chosen on seed 1 among 0 / 1 / 2 / 4 / 8 / 16,
  // docs/design/ymir-estimators.md); the speed-up is fitted in
  // time (slicesim --iter-transfer-fit time|loss).
  ymir::TransferWatchOptions iter_transfer_watch = {.prior_points = 4};
  bool iter_transfer_online = true;
  // Also reported (YmirEstimatorReport::transfer_watch_sweep): the same
  // refinement after these watches, each >= eval_every.
  std::vector<double> iter_transfer_watch_sweep = {8, 24, 32};
  int64_t stop_loss_epoch_steps = 4;
  double stop_loss_window_epochs = 2.0;
  synth::LanguageOptions language = {.vocab = 32};  // 32 of the backbone's 256 token ids
  // A real task family instead of the synthetic one: the tasks are WordNet
  // gloss tasks (synth/wordnet.h; 2 classes each), their examples drawn from
  // this corpus, whose vocabulary must fit the backbone's. Null: synthetic.
  std::shared_ptr<const synth::WordNetCorpus> wordnet;
  // Only the normal runs (slicesim --curves-only): the learning curves,
  // targets and iteration fits of every task, and the null runs and neutral
  // band; no embeddings, pairs or scores. For checking that a task family is learnt within the budget
  // before any pair is run (docs/design/ymir-estimators.md).
  bool curves_only = false;
  // Only the Task2Vec embeddings and the similarity matrix (slicesim
  // --similarities-only): the probes (for kTrained, the first probe_steps of
  // each normal run), the Fishers and S(A, B); no curves, pairs or scores,
  // repeat 0 only. For checking the similarities across seeds and
  // relatedness levels at a fraction of a full run's cost.
  bool similarities_only = false;
  // P above, for a fraction.
  int64_t PrefixSteps(double fraction) const;
  int64_t IterPrefixSteps() const { return PrefixSteps(iter_prefix_fraction); }
  absl::Status Validate() const;
};

// d_sym and d_asym above (cosine distances in [0, 2]).
double SymmetricDistance(const std::vector<double>& a, const std::vector<double>& b,
                         YmirDistance kind = YmirDistance::kNormalised);
double AsymmetricDistance(const std::vector<double>& from, const std::vector<double>& to,
                          const std::vector<double>& trivial, double alpha,
                          YmirDistance kind = YmirDistance::kNormalised);
// Appends the Fisher of one example's gradient `grads` with weight w (w g^2,
// element-wise) to the embedding `fisher` (sized on first use) in the
// coordinates of `embed`: the LoRA factors in NamedTensors order, then for
// kLoraHead the head's squared gradient summed over its outputs per hidden
// unit. InvalidArgument when the coordinates do not match `fisher`'s.
absl::Status AddFisher(const TaskAdapters& grads, double w, YmirEmbedParams embed,
                       std::vector<double>& fisher);

struct YmirPair {
  std::string task_a, task_b;
  std::string mode;  // "temporal" (A then B) or "spatial" (A with B); the gain is B's
  double similarity = 0;
  double asymmetry = 0;       // S(A, B) - S(B, A), for both modes (the regressor of kAsymmetry)
  double steps_normal = 0;    // of B (interpolated, see below)
  double steps_transfer = 0;  // of B; max_steps + 1 when censored
  bool censored = false;
  double gain = 0;            // measured (gain_measure)
  double gain_steps = 0;      // the kSteps gain, whatever gain_measure is (for comparison)
  bool gain_clamped = false;  // kArea: the speed-up is a bound of its range
  double predicted_gain = 0;  // leave-one-out
  // Iteration estimator: B's steps under this transfer predicted from B's
  // normal prefix and predicted_gain (averaged over repeats).
  double predicted_steps_transfer = 0;
  // The refinement after watching the run (iter_transfer_online; averaged
  // over repeats): the estimate, the watched speed-up against B's normal
  // curve (1 + the effective gain), and the repeats whose run reached the
  // target within the watch (their estimate is the observed crossing).
  double predicted_steps_transfer_watched = 0;
  double watched_speedup = 0;
  int64_t reached_in_watch = 0;
  // Repeat 0's transfer eval curve (B's losses), for offline analysis.
  std::vector<ymir::LossPoint> curve;
  // Stop-loss: repeats in which the pairing was decoupled, the step of the
  // (first) decoupling, and the steps to target with stop-loss (= steps_transfer
  // where it kept the pairing or the mode is temporal).
  int64_t stop_loss_decoupled = 0;
  int64_t stop_loss_step = 0;
  double steps_transfer_stop_loss = 0;
};

// The rows the gain model of `mode` is fitted on: with fit_on set, indices
// into o.fit_on, else into `pairs` (this run's), of that mode; with
// o.holdout_tasks, none that involves a held-out task.
std::vector<size_t> GainModelFitRows(const YmirExperimentOptions& o, const std::vector<YmirPair>& pairs,
                                     std::string_view mode);

// Iteration estimator errors (%, see above) for one prefix: normal runs
// over the tasks; transfer runs over the uncensored pairs, with the
// predicted gain and, for comparison, ignoring the transfer (gain 0).
struct YmirIterationErrors {
  double fraction = 0;
  int64_t prefix_steps = 0;
  double normal_pct = 0;
  double normal_max_pct = 0;
  double transfer_pct = 0;
  double transfer_max_pct = 0;
  double transfer_temporal_pct = 0;
  double transfer_spatial_pct = 0;
  double transfer_nogain_pct = 0;
  // The prior (from the predicted gain, at step 0): equal to transfer_* above
  // unless the transfer runs were watched (YmirExperimentOptions::
  // iter_transfer_watch): then transfer_* are the watched estimates, made
  // after watch_steps steps of each transfer run, of which reached_in_watch
  // pair runs (over repeats) had already reached the target.
  double transfer_prior_pct = 0;
  double transfer_prior_temporal_pct = 0;
  double transfer_prior_spatial_pct = 0;
  double watch_steps = 0;
  int64_t reached_in_watch = 0;
  // Watched: over the pairs none of whose runs reached the target within the
  // watch (their estimates are extrapolations, not observations), the
  // watched and the prior's error, and how many such pairs.
  double transfer_unreached_pct = 0;
  double transfer_prior_unreached_pct = 0;
  int64_t transfer_unreached_pairs = 0;
  int64_t transfer_pairs = 0;  // uncensored pairs scored
  int64_t unreachable = 0;     // task fits (over repeats) that never reach the target
  // Predictions beyond max_steps, scored as censored (max_steps + 1, like an
  // unreachable fit): tasks (normal_pct) and scored pairs (transfer_pct).
  int64_t normal_beyond_limit = 0;
  int64_t transfer_beyond_limit = 0;
  // What the estimator saw: the step at which each task's estimate became
  // available, mean and max over tasks and repeats (prefix_steps for a fixed
  // prefix); online: whether these are EstimateOnline's, and how many task
  // runs (over repeats) had a plateau in the first window.
  bool online = false;
  double observed_steps_mean = 0;
  double observed_steps_max = 0;
  int64_t plateaus = 0;
};

// The iteration estimator on one task's normal run (repeat 0's fit).
struct YmirIterationFit {
  double r = 0, d = 0, b1 = 0, b2 = 0, scale = 0, rmse = 0;
  int64_t prefix_points = 0;
  double fit_from_step = 0;        // where the fitted points start (the warm-up end)
  int64_t fitted_points = 0;       // after the transient rule
  int64_t convergence_step = 0;    // improvement <= 0.001 per step
  double predicted_steps = 0;      // to the task's target, averaged over repeats
  int64_t unreachable = 0;         // repeats whose fitted curve never reached it
  // The online estimate (iter_online): repeat 0's plateau flag and onset,
  // the step at which the estimate became available and the prediction
  // (max_steps + 1 without one), averaged over repeats.
  bool plateau = false;
  double onset = 0;
  double observed_until = 0;
  double online_predicted_steps = 0;
};

struct YmirModeScore {
  std::string mode;
  int64_t pairs = 0;
  int64_t positive = 0;               // measured gain > 0
  double accuracy_pct = 0;            // sign agreement, leave-one-out
  double majority_accuracy_pct = 0;   // always predicting the more common sign
  // The same over the non-neutral pairs (|gain| >= the neutral band).
  int64_t neutral = 0;
  double non_neutral_accuracy_pct = 0;
  double non_neutral_majority_pct = 0;
  // Positive / neutral / negative, the prediction classed by the same band.
  double three_way_accuracy_pct = 0;
  double three_way_majority_pct = 0;
  double mape_pct = 0;                // on 1 + gain, leave-one-out
  double in_sample_accuracy_pct = 0;  // with the fit on all pairs
  double in_sample_mape_pct = 0;
  double correlation = 0;  // Pearson r(similarity, gain)
  LinearFit fit;           // gain ~ similarity on all pairs of this run
  // The gain model's weights (w0, w1[, w2], see YmirDirection) on all its
  // rows: this run's pairs of the mode, or fit_on's.
  std::vector<double> model;
};

struct YmirEstimatorReport {
  YmirExperimentOptions options;
  std::vector<std::string> tasks;
  std::vector<double> normal_initial_loss;  // per task: eval loss at step 0
  std::vector<double> normal_best_loss;     // per task: lowest eval loss of the normal run
  std::vector<double> normal_target_loss;   // per task
  std::vector<double> normal_steps;         // per task: steps to its own target
  std::vector<YmirIterationFit> iteration_fits;  // per task
  // Per task: repeat 0's normal eval curve, every evaluation (prefix included).
  std::vector<std::vector<ymir::LossPoint>> normal_curves;
  std::vector<YmirPair> pairs;
  // similarity[a][b] = S(a, b) (temporal, directed); the diagonal is S(a, a).
  std::vector<std::vector<double>> similarity;
  // Null runs (NeutralBand), task-major: task i's u-th at i x null_runs + u - 1.
  struct NullRun {
    std::string task;
    double steps = 0;  // to the task's target, averaged over repeats
    double gain = 0;   // measured like a pair's gain (gain_measure)
  };
  std::vector<NullRun> null_runs;
  double neutral_band = 0;
  std::vector<YmirModeScore> scores;  // temporal, spatial, all
  // Iteration estimator errors: the headline (online, or the fixed prefix P
  // with iter_online off), the fixed prefix P, and the sweep's prefixes.
  YmirIterationErrors iteration;
  YmirIterationErrors iteration_first_window;
  std::vector<YmirIterationErrors> iteration_sweep;
  // The headline's errors with the transfer runs watched for each of
  // iter_transfer_watch_sweep's watches instead (empty with the watch off).
  std::vector<YmirIterationErrors> transfer_watch_sweep;
  // Negative pairs (measured gain < 0) and how many were caught: by the
  // estimator (leave-one-out predicted gain <= 0, so Ymir would not pair
  // them) and by the stop-loss (decoupled in a majority of repeats); positive
  // pairs wrongly decoupled.
  int64_t negative_pairs = 0;
  int64_t negative_caught_by_estimator = 0;
  int64_t negative_caught_by_stop_loss = 0;
  int64_t negative_caught = 0;  // by either
  int64_t positive_decoupled = 0;
  int64_t train_steps = 0;            // optimizer steps run in total
  double seconds = 0;

  // The k pairs with the largest measured speed-up in steps to target,
  // steps_normal / steps_transfer = 1 + gain_steps (B's steps to its normal
  // bar alone over its steps under the transfer), largest first, ties in
  // pair order; whatever gain_measure is. A censored transfer run's
  // speed-up is an upper bound (it needs at least max_steps + 1 steps).
  // ToJson prints them as "best_pairs_steps" (the "measured speed-up in
  // steps-to-target of the best pairs" of docs/results.md); its
  // "best_pairs" rank by the measured gain (gain_measure) instead and carry
  // the steps speed-up beside it.
  std::vector<size_t> BestPairsBySteps(size_t k) const;

  std::string ToJson() const;
  // Gains table, format 2 (LoadYmirGains, configs/ymir/README.md): the
  // comments "# gains-format: 2", "# gain-definition: speedup" and
  // "# gain-measure: area|steps", then the header
  // task_a,task_b,mode,gain,gain_steps,steps_censored and a row per pair:
  // gain as defined above, gain_steps = YmirPair::gain_steps, steps_censored
  // 1 when a repeat of the transfer run was censored (gain_steps is then an
  // upper bound: the run needs at least 1 / (1 + gain_steps) x the steps).
  std::string GainsCsv() const;
  // task_a,task_b,mode,similarity,asymmetry,gain per pair (ParseYmirPairsCsv).
  std::string PairsCsv() const;
};

// Runs the whole experiment on `backbone` (f32).
absl::StatusOr<YmirEstimatorReport> RunYmirEstimators(const LlamaWeights& backbone,
                                                      const YmirExperimentOptions& options);

}  // namespace slicesched::executor
