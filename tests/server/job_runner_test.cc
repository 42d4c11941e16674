// The fine-tuning job runner (server/job_runner.h) on a real Master with
// LibTorch CPU executors and a real JobManager: jobs run as "<dep>/train"
// instances through the operator-level scheduler, stop on their condition,
// checkpoint and resume exactly, fail with a reason, and the planner pairs
// only what may be paired. The planning clock is a ManualClock; the runner
// waits on instance records (condition waits), never sleeps.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "slicesched/common/clock.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/kernels/llama_kernels.h"
#include "slicesched/executor/train/train_ops.h"
#include "slicesched/jobs/job_manager.h"
#include "slicesched/server/config.h"
#include "slicesched/server/job_runner.h"
#include "slicesched/server/master.h"
#include "slicesched/synth/tasks.h"
#include "slicesched/ymir/time_lut.h"
#include "job_runner_fixture.h"
#include "synth/wordnet_fixture.h"

namespace slicesched {
namespace {

using ::testing::HasSubstr;

std::string SyntheticJob(const std::string& name, const std::string& task, const std::string& extra = "",
                         int examples = 80, int max_epochs = 2) {
  return StrCat("name: ", name,
                "\nbackbone: tiny\n"
                "dataset: {synthetic: {task: ",
                task, ", seed: 3, examples: ", examples,
                ", sequence_length: 8}}\n"
                "hyperparameters: {learning_rate: 0.01, batch_size: 8}\n"
                "stop: {metric: accuracy, target: 0.999, max_epochs: ",
                max_epochs, "}\n", extra);
}

class JobRunnerTest : public JobRunnerFixture {
 protected:
  void StartDaemon(int devices, PlannerConfig planner = {}) {
    StartMaster("t", devices);
    planner_ = planner;
    OpenJobs();
  }
  // A job of `iterations` one-micro-batch iterations run to completion: the
  // runner's own micro-batches, the final checkpoint, and the backbone.
  struct FinishedJob {
    std::vector<executor::TrainBatch> micro_batches;
    executor::TaskState state;
    std::shared_ptr<const executor::LlamaWeights> weights;
  };
  void RunToCompletion(uint64_t id, int iterations, FinishedJob* out) {
    ASSERT_TRUE(TickUntil([&] {
      executor::TrainBatch x;
      return runner_->MicroBatchOf(id, 0, &x);
    }));
    for (int k = 0; k < iterations; ++k) {
      executor::TrainBatch x;
      ASSERT_TRUE(runner_->MicroBatchOf(id, k, &x));
      out->micro_batches.push_back(x);
    }
    ASSERT_TRUE(TickUntil([&] { return jobs::IsTerminal(Job(id).state); }));
    const jobs::JobInfo j = Job(id);
    ASSERT_EQ(j.state, jobs::JobState::kCompleted) << j.message;
    EXPECT_EQ(j.iterations_done, iterations);
    auto weights = master_->BackboneWeights("tiny-ft");
    ASSERT_TRUE(weights.ok()) << weights.status();
    out->weights = *weights;
    auto got = executor::LoadTaskCheckpoint(j.checkpoint_path, out->weights->dims());
    ASSERT_TRUE(got.ok()) << got.status();
    out->state = *std::move(got);
  }
  const JobEvent* FindEvent(uint64_t id, const std::string& kind, std::vector<JobEvent>* keep) {
    *keep = Events(id);
    for (const JobEvent& e : *keep) {
      if (e.kind == kind) return &e;
    }
    return nullptr;
  }
  // The first event of `kind` whose details contain `part`.
  const JobEvent* FindEventWith(uint64_t id, const std::string& kind, const std::string& part,
                                std::vector<JobEvent>* keep) {
    *keep = Events(id);
    for (const JobEvent& e : *keep) {
      if (e.kind == kind && e.details_json.find(part) != std::string::npos) return &e;
    }
    return nullptr;
  }
  std::vector<std::string> Kinds(uint64_t id) {
    std::vector<std::string> out;
    for (const JobEvent& e : Events(id)) out.push_back(e.kind);
    return out;
  }
};

// A job on the synthetic generator runs its micro-batches through the
// scheduler until the epoch limit comes first: completed, censored, with
// the iteration count the limit implies (80 examples: 64 train, 8 rows per
// iteration -> 8 per epoch, 2 epochs), and the context switch reported.
TEST_F(JobRunnerTest, SyntheticJobRunsToItsEpochLimitAndIsRecordedCensored) {
  StartDaemon(2);
  NewRunner();
  const uint64_t id = Submit(SyntheticJob("parity-a", "parity"));
  ASSERT_TRUE(TickUntil([&] { return jobs::IsTerminal(Job(id).state); }));
  const jobs::JobInfo j = Job(id);
  ASSERT_EQ(j.state, jobs::JobState::kCompleted) << j.message;
  EXPECT_EQ(j.iterations_done, 16);
  EXPECT_EQ(runner_->stats().steps_done, 16u);
  std::vector<JobEvent> ev;
  const JobEvent* run = FindEvent(id, "running", &ev);
  ASSERT_NE(run, nullptr);
  EXPECT_THAT(run->details_json, HasSubstr("\"mode\":\"alone\""));
  EXPECT_THAT(run->details_json, HasSubstr("\"devices\":[0]"));
  const JobEvent* progress = FindEventWith(id, "progress", "context_switch_ms", &ev);
  ASSERT_NE(progress, nullptr);
  EXPECT_THAT(progress->details_json, HasSubstr("first_step_ms"));
  const JobEvent* done = FindEvent(id, "completed", &ev);
  ASSERT_NE(done, nullptr);
  EXPECT_THAT(done->details_json, HasSubstr("\"censored\":1"));
  EXPECT_THAT(done->details_json, HasSubstr("\"accuracy\":"));
  EXPECT_FALSE(j.checkpoint_path.empty());
  EXPECT_TRUE(std::filesystem::exists(j.checkpoint_path));
}

// optimizer: sgd runs (SGD with momentum, the job's own momentum): the job
// completes its 5 iterations and its checkpoint is exactly the training
// operators' SgdStep training on the runner's own micro-batches from the
// job's fresh state (seed 0, lr 0.01, momentum 0.5), optimizer and momentum
// included.
TEST_F(JobRunnerTest, SgdJobTrainsWithMomentumExactlyAsTheOperators) {
  StartDaemon(1);
  NewRunner();
  std::string yaml = SyntheticJob("sgd-a", "parity", "", 80, 2);
  yaml.replace(yaml.find("batch_size: 8"), 13, "batch_size: 8, optimizer: sgd, momentum: 0.5");
  yaml.replace(yaml.find("max_epochs: 2"), 13, "max_epochs: 2, max_iterations: 5");
  const uint64_t id = Submit(yaml);
  FinishedJob f;
  ASSERT_NO_FATAL_FAILURE(RunToCompletion(id, 5, &f));
  const LlamaDims dims = f.weights->dims();
  const executor::TaskState* got = &f.state;
  const std::vector<executor::TrainBatch>& mb = f.micro_batches;
  EXPECT_EQ(got->optimizer, executor::OptimizerKind::kSgd);
  EXPECT_EQ(got->momentum, 0.5);
  executor::SetIntraOpThreadsForThisThread(1);  // as on the device threads
  executor::AdamWOptions o;
  o.lr = 0.01;
  auto direct = executor::TaskState::Init(dims, executor::LoraConfig{8, 16}, 2, 0, o);
  ASSERT_TRUE(direct.ok()) << direct.status();
  direct->optimizer = executor::OptimizerKind::kSgd;
  direct->momentum = 0.5;
  for (int k = 0; k < 5; ++k) {
    ASSERT_TRUE(executor::AccumulateMicroBatch(*f.weights, *direct, mb[static_cast<size_t>(k)]).ok());
    ASSERT_TRUE(executor::SgdStep(*direct).ok());
  }
  EXPECT_TRUE(BitEqual(*got, *direct)) << "not SGD with momentum on the job's micro-batches";
}

// A loss target the first evaluation already meets stops the job there, not
// censored.
TEST_F(JobRunnerTest, JobStopsWhenItsTargetMetricIsReached) {
  StartDaemon(1);
  NewRunner();
  const uint64_t id = Submit(
      "name: easy\nbackbone: tiny\ndataset: {synthetic: {task: fa-major, seed: 1, examples: 80, sequence_length: 8}}\n"
      "hyperparameters: {learning_rate: 0.01, batch_size: 8}\n"
      "stop: {metric: loss, target: 100, max_epochs: 5}\n");
  ASSERT_TRUE(TickUntil([&] { return jobs::IsTerminal(Job(id).state); }));
  const jobs::JobInfo j = Job(id);
  ASSERT_EQ(j.state, jobs::JobState::kCompleted) << j.message;
  EXPECT_EQ(j.iterations_done, 8);  // the first evaluation: the end of epoch 1
  std::vector<JobEvent> ev;
  const JobEvent* done = FindEvent(id, "completed", &ev);
  ASSERT_NE(done, nullptr);
  EXPECT_THAT(done->details_json, HasSubstr("\"censored\":0"));
}

// Checkpoint, "restart" (a new JobManager over the same database requeues
// the running job with its checkpoint, and a new runner), resume: the
// training position continues from the checkpoint, not from scratch, and
// the loaded state equals the saved one bit for bit.
TEST_F(JobRunnerTest, RunningJobResumesFromItsCheckpointAfterARestart) {
  StartDaemon(1);
  NewRunner();
  const uint64_t id = Submit(SyntheticJob("resume-me", "fa-major", "", 400, 3));
  ASSERT_TRUE(TickUntil([&] { return runner_->TrainingPosition(id).first >= 3; }));
  runner_->Stop();  // waits for the micro-batch in flight, checkpoints
  const auto saved = runner_->TrainingPosition(id);
  runner_.reset();
  jobs::JobInfo before = Job(id);
  ASSERT_EQ(before.state, jobs::JobState::kRunning);
  ASSERT_FALSE(before.checkpoint_path.empty());
  EXPECT_EQ(before.iterations_done, saved.first);
  auto dims = LlamaPreset("tiny");
  ASSERT_TRUE(dims.ok());
  auto on_disk = executor::LoadTaskCheckpoint(before.checkpoint_path, *dims);
  ASSERT_TRUE(on_disk.ok()) << on_disk.status();
  EXPECT_EQ(on_disk->step, saved.first);
  EXPECT_EQ(on_disk->accumulated, saved.second);

  OpenJobs();  // the restart: running -> queued with a "recovered" event
  EXPECT_EQ(Job(id).state, jobs::JobState::kQueued);
  std::vector<JobEvent> ev;
  ASSERT_NE(FindEvent(id, "recovered", &ev), nullptr);
  NewRunner();
  ASSERT_TRUE(runner_->Tick().ok());  // plans, loads the checkpoint, issues the next micro-batch
  EXPECT_EQ(Job(id).state, jobs::JobState::kRunning);
  // Loaded from the checkpoint (the micro-batch just issued may already have
  // stepped once more, never less): not from scratch.
  const auto resumed = runner_->TrainingPosition(id);
  EXPECT_GE(resumed.first, saved.first);
  EXPECT_LE(resumed.first, saved.first + 1);
  std::vector<JobEvent> runs;
  for (const JobEvent& e : Events(id)) {
    if (e.kind == "running") runs.push_back(e);
  }
  ASSERT_EQ(runs.size(), 2u);  // before and after the restart
  EXPECT_THAT(runs.back().details_json, HasSubstr("\"resume_from\":"));
  ASSERT_TRUE(TickUntil([&] { return runner_->TrainingPosition(id).first > saved.first; }));
  EXPECT_GT(Job(id).iterations_done + runner_->TrainingPosition(id).first, saved.first);
}

// A cancelled running job stops training: its micro-batch in flight ends,
// nothing more is issued and the runner drops its state.
TEST_F(JobRunnerTest, CancelledJobStopsTraining) {
  StartDaemon(1);
  NewRunner();
  const uint64_t id = Submit(SyntheticJob("cancel-me", "fa-major", "", 400, 3));
  ASSERT_TRUE(TickUntil([&] { return runner_->TrainingPosition(id).first >= 1; }));
  ASSERT_TRUE(jobs_->Cancel(id, "test").ok());
  ASSERT_TRUE(TickUntil([&] { return runner_->TrainingPosition(id).first == -1; }, 100));
  const uint64_t steps = runner_->stats().steps_done;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(runner_->Tick().ok());
  EXPECT_EQ(runner_->stats().steps_done, steps);
  EXPECT_EQ(Job(id).state, jobs::JobState::kCancelled);
}

// A dataset the backbone cannot read fails the job with a reason naming the
// problem; other jobs are unaffected.
TEST_F(JobRunnerTest, BadDatasetFailsTheJobWithAReason) {
  StartDaemon(1);
  const std::string data = StrCat(dir_, "/bad.jsonl");
  {
    std::ofstream out(data);
    out << "{\"tokens\": [1, 2, 3], \"label\": 0}\n{\"tokens\": [4, 999, 6], \"label\": 1}\n";
  }
  NewRunner();
  const uint64_t id = Submit(StrCat("name: bad\nbackbone: tiny\ndataset: {path: ", data,
                                    "}\nhyperparameters: {learning_rate: 0.01, batch_size: 2}\n"
                                    "stop: {metric: accuracy, target: 0.9, max_epochs: 1}\n"));
  ASSERT_TRUE(TickUntil([&] { return jobs::IsTerminal(Job(id).state); }, 50));
  const jobs::JobInfo j = Job(id);
  EXPECT_EQ(j.state, jobs::JobState::kFailed);
  EXPECT_THAT(j.message, HasSubstr("token id 999 outside the backbone's vocabulary"));
}

// A `wordnet` dataset: the job trains on glosses of the corpus in the
// package's format (binary labels, the backbone's vocabulary), with a zero
// head and a 2-step warm-up, exactly as the training operators train on the
// job's own micro-batches. A corpus that is gone by the time the job is
// prepared fails the job with a reason naming the file.
TEST_F(JobRunnerTest, WordNetJobTrainsOnTheCorpusWithAZeroHeadAndAWarmUp) {
  const std::string wn = synth::WriteWordNetFixture(StrCat("runner_wn_", ::getpid()), synth::kWordNetFixture);
  StartDaemon(1);
  NewRunner();
  auto job = [&](const std::string& name, const std::string& corpus) {
    return StrCat("name: ", name, "\nbackbone: tiny\n",
                  "dataset: {wordnet: {task: animal-plant, seed: 3, examples: 80, sequence_length: 8, dir: ", corpus,
                  "}}\nhyperparameters: {learning_rate: 0.01, batch_size: 8, head_init: zero, warmup_steps: 2}\n"
                  "stop: {metric: loss, target: 0, max_epochs: 2, max_iterations: 5}\n");
  };
  const uint64_t id = Submit(job("wn-a", wn));
  FinishedJob f;
  ASSERT_NO_FATAL_FAILURE(RunToCompletion(id, 5, &f));
  for (const executor::TrainBatch& x : f.micro_batches) {
    for (int64_t t : x.tokens.ToInt64()) ASSERT_TRUE(t >= 0 && t < 256) << t;
  }
  const LlamaDims dims = f.weights->dims();
  const executor::TaskState* got = &f.state;
  EXPECT_EQ(got->params.head_outputs(), 2);
  EXPECT_EQ(got->adamw.warmup_steps, 2);
  executor::SetIntraOpThreadsForThisThread(1);  // as on the device threads
  executor::AdamWOptions o;
  o.lr = 0.01;
  o.warmup_steps = 2;
  auto direct = executor::TaskState::Init(dims, executor::LoraConfig{8, 16}, 2, 0, o);
  ASSERT_TRUE(direct.ok()) << direct.status();
  auto zeros = executor::TaskAdapters::ZerosLike(direct->params);
  ASSERT_TRUE(zeros.ok()) << zeros.status();
  direct->params.head = zeros->head;
  for (int k = 0; k < 5; ++k) {
    ASSERT_TRUE(executor::AccumulateMicroBatch(*f.weights, *direct, f.micro_batches[static_cast<size_t>(k)]).ok());
    ASSERT_TRUE(executor::AdamWStep(*direct).ok());
  }
  EXPECT_TRUE(BitEqual(*got, *direct)) << "not a zero head with a warm-up on the job's micro-batches";

  const std::string gone = synth::WriteWordNetFixture(StrCat("runner_wn_gone_", ::getpid()), synth::kWordNetFixture);
  const uint64_t bad = Submit(job("wn-gone", gone));
  std::filesystem::remove(gone + "/data.noun");
  ASSERT_TRUE(TickUntil([&] { return jobs::IsTerminal(Job(bad).state); }, 50));
  EXPECT_EQ(Job(bad).state, jobs::JobState::kFailed);
  EXPECT_THAT(Job(bad).message, HasSubstr(gone + "/data.noun"));
}

// Datasets a user points a job at (the formats in
// docs/operations.md): the same examples as a JSONL file, as a tokens-bin
// file and from the built-in generator train bit-identical jobs (the same
// rows, head size and held-out split, whatever the format).
TEST_F(JobRunnerTest, JsonlAndTokensBinFilesTrainLikeTheGeneratorsDataset) {
  StartDaemon(1);
  synth::DatasetOptions o;
  o.task = "fa-major";
  o.seed = 3;
  o.examples = 80;
  o.sequence_length = 8;
  auto weights = master_->BackboneWeights("tiny-ft");
  ASSERT_TRUE(weights.ok()) << weights.status();
  o.language.vocab = (*weights)->dims().vocab;
  auto examples = synth::Generate(o);
  ASSERT_TRUE(examples.ok()) << examples.status();
  const std::string jsonl = StrCat(dir_, "/fa.jsonl"), bin = StrCat(dir_, "/fa.bin");
  ASSERT_TRUE(synth::WriteJsonl(jsonl, *examples).ok());
  ASSERT_TRUE(synth::WriteTokensBin(bin, *examples).ok());
  NewRunner();
  auto file_job = [](const std::string& name, const std::string& path) {
    return StrCat("name: ", name, "\nbackbone: tiny\ndataset: {path: ", path,
                  "}\nhyperparameters: {learning_rate: 0.01, batch_size: 8}\n"
                  "stop: {metric: accuracy, target: 0.999, max_epochs: 2, max_iterations: 5}\n");
  };
  const uint64_t from_jsonl = Submit(file_job("from-jsonl", jsonl));
  const uint64_t from_bin = Submit(file_job("from-bin", bin));
  std::string synthetic = SyntheticJob("from-generator", "fa-major");
  synthetic.replace(synthetic.find("max_epochs: 2"), 13, "max_epochs: 2, max_iterations: 5");
  const uint64_t generated = Submit(synthetic);
  ASSERT_TRUE(TickUntil([&] {
    return jobs::IsTerminal(Job(from_jsonl).state) && jobs::IsTerminal(Job(from_bin).state) &&
           jobs::IsTerminal(Job(generated).state);
  }));
  const LlamaDims dims = (*weights)->dims();
  std::vector<executor::TaskState> states;
  for (uint64_t id : {from_jsonl, from_bin, generated}) {
    const jobs::JobInfo j = Job(id);
    ASSERT_EQ(j.state, jobs::JobState::kCompleted) << j.name << ": " << j.message;
    EXPECT_EQ(j.iterations_done, 5) << j.name;
    auto st = executor::LoadTaskCheckpoint(j.checkpoint_path, dims);
    ASSERT_TRUE(st.ok()) << st.status();
    states.push_back(*st);
  }
  EXPECT_EQ(states[0].step, 5);
  EXPECT_TRUE(BitEqual(states[0], states[1])) << "JSONL and tokens-bin";
  EXPECT_TRUE(BitEqual(states[0], states[2])) << "JSONL and the generator";
}

// Pairing: with a gains table that makes fa-major -> fa-inv very useful and
// one device, Ymir runs the pair temporally; a job that opts out of sharing,
// or one of another trust domain, is never paired; the elastic fallback
// never pairs.
class JobRunnerPairingTest : public JobRunnerTest {
 protected:
  // `temporal_sign`: a sign column, the temporal rows' value ("" = none).
  PlannerConfig WithGains(PlannerConfig::Mode mode, const std::string& temporal_sign = "") {
    const std::string gains = StrCat(::testing::TempDir(), "/gains_", ::getpid(), ".csv");
    std::ofstream out(gains);
    const std::string t = temporal_sign.empty() ? "" : "," + temporal_sign;
    out << "task_a,task_b,mode,gain" << (t.empty() ? "" : ",sign") << "\n"
        << "fa-major,fa-inv,temporal,0.9" << t << "\n"
        << "fa-inv,fa-major,temporal,0.9" << t << "\n"
        << "fa-major,fa-inv,spatial,-0.5" << (t.empty() ? "" : ",negative") << "\n";
    PlannerConfig p;
    p.mode = mode;
    p.gains_path = gains;
    return p;
  }
  // Submits the related pair of the gains table (fa-major a, fa-inv b, one
  // trust domain), profiles both and plans once.
  std::pair<uint64_t, uint64_t> SubmitRelatedPairAndPlan() {
    const uint64_t a = Submit(SyntheticJob("a", "fa-major", "trust_domain: lab\n"));
    const uint64_t b = Submit(SyntheticJob("b", "fa-inv", "trust_domain: lab\n"));
    ProfileAndPlan({a, b});
    return {a, b};
  }
  // Plans once; returns the mode of each job's first "running" event ("" if none).
  std::string RunMode(uint64_t id) {
    std::vector<JobEvent> ev;
    const JobEvent* run = FindEvent(id, "running", &ev);
    if (run == nullptr) return "";
    for (const char* m : {"alone", "temporal", "spatial"}) {
      if (run->details_json.find(StrCat("\"mode\":\"", m, "\"")) != std::string::npos) return m;
    }
    return "?";
  }
};

TEST_F(JobRunnerPairingTest, YmirPairsRelatedJobsTemporally) {
  StartDaemon(1, WithGains(PlannerConfig::Mode::kYmir));
  NewRunner();
  const auto [a, b] = SubmitRelatedPairAndPlan();
  const std::string ma = RunMode(a), mb = RunMode(b);
  ASSERT_TRUE(ma == "temporal" || mb == "temporal") << ma << " / " << mb;
  const uint64_t source = ma == "temporal" ? a : b, target = source == a ? b : a;
  EXPECT_EQ(Job(target).state, jobs::JobState::kQueued);  // waits for its source
  // The source completes; the target then starts from its adapters.
  ASSERT_TRUE(TickUntil([&] { return jobs::IsTerminal(Job(a).state) && jobs::IsTerminal(Job(b).state); }));
  EXPECT_EQ(Job(a).state, jobs::JobState::kCompleted) << Job(a).message;
  EXPECT_EQ(Job(b).state, jobs::JobState::kCompleted) << Job(b).message;
  std::vector<JobEvent> ev;
  const JobEvent* progress = FindEventWith(target, "progress", "temporal_source", &ev);
  ASSERT_NE(progress, nullptr);
  EXPECT_THAT(progress->details_json, HasSubstr(StrCat("\"temporal_source\":", source)));
}

// A gain whose repeats' interval includes 0 (sign neutral) is not offered:
// the related pair of the tests above runs alone, one job after the other.
TEST_F(JobRunnerPairingTest, NeutralGainsAreNotPaired) {
  StartDaemon(1, WithGains(PlannerConfig::Mode::kYmir, "neutral"));
  NewRunner();
  const auto [a, b] = SubmitRelatedPairAndPlan();
  EXPECT_EQ(RunMode(a) + RunMode(b), "alone") << RunMode(a) << " / " << RunMode(b);
}

// planner.neutral_pairs: plan pairs them on their point estimates again; a
// positive sign is paired either way.
TEST_F(JobRunnerPairingTest, NeutralGainsArePairedWhenAskedFor) {
  for (const bool neutral : {true, false}) {
    SCOPED_TRACE(neutral ? "neutral, pair_neutral" : "positive");
    StopDaemon();
    PlannerConfig p = WithGains(PlannerConfig::Mode::kYmir, neutral ? "neutral" : "positive");
    p.pair_neutral = neutral;
    StartDaemon(1, p);
    NewRunner();
    const auto [a, b] = SubmitRelatedPairAndPlan();
    EXPECT_TRUE(RunMode(a) == "temporal" || RunMode(b) == "temporal") << RunMode(a) << " / " << RunMode(b);
  }
}

// With a device for each job, pairing would only make one wait or share:
// the related pair of the test above runs alone, in parallel.
TEST_F(JobRunnerPairingTest, YmirPairsOnlyWhileTheDevicesAreContended) {
  StartDaemon(2, WithGains(PlannerConfig::Mode::kYmir));
  NewRunner();
  const auto [a, b] = SubmitRelatedPairAndPlan();
  EXPECT_EQ(RunMode(a), "alone");
  EXPECT_EQ(RunMode(b), "alone");
  EXPECT_NE(Job(a).plan.devices, Job(b).plan.devices);
}

TEST_F(JobRunnerPairingTest, OptOutAndOtherTrustDomainAreNeverPaired) {
  StartDaemon(1, WithGains(PlannerConfig::Mode::kYmir));
  NewRunner();
  const uint64_t a = Submit(SyntheticJob("a", "fa-major", "trust_domain: lab\n", 400, 3));
  const uint64_t b = Submit(SyntheticJob("b", "fa-inv", "trust_domain: lab\nallow_sharing: false\n", 400, 3));
  const uint64_t c = Submit(SyntheticJob("c", "fa-inv", "trust_domain: other\n", 400, 3));
  ProfileAndPlan({a, b, c});
  for (uint64_t id : {a, b, c}) {
    const std::string m = RunMode(id);
    EXPECT_TRUE(m == "" || m == "alone") << "job " << id << ": " << m;
  }
}

TEST_F(JobRunnerPairingTest, ElasticFallbackNeverPairs) {
  StartDaemon(1, WithGains(PlannerConfig::Mode::kElastic));
  NewRunner();
  const uint64_t a = Submit(SyntheticJob("a", "fa-major", "trust_domain: lab\n", 400, 3));
  const uint64_t b = Submit(SyntheticJob("b", "fa-inv", "trust_domain: lab\n", 400, 3));
  ProfileAndPlan({a, b});
  for (uint64_t id : {a, b}) {
    const std::string m = RunMode(id);
    EXPECT_TRUE(m == "" || m == "alone") << "job " << id << ": " << m;
  }
}

// The baseline planner modes drive the same runner. On one device, with a
// related pair the gains table would pair: SRTF runs the job with less time
// left (submitted second) and keeps the other queued; Pollux-like admits the
// first arrival (equal waits on the test clock: the lower id). Neither pairs,
// and both jobs complete.
TEST_F(JobRunnerPairingTest, SrtfAndPolluxLikeModesPlanByTheirOwnRules) {
  for (const auto mode : {PlannerConfig::Mode::kSrtf, PlannerConfig::Mode::kPollux}) {
    SCOPED_TRACE(std::string(PlannerModeName(mode)));
    StopDaemon();
    StartDaemon(1, WithGains(mode));
    NewRunner();
    const uint64_t longer = Submit(SyntheticJob("long", "fa-major", "trust_domain: lab\n", 400, 2));
    const uint64_t shorter = Submit(SyntheticJob("short", "fa-inv", "trust_domain: lab\n", 80, 2));
    ProfileAndPlan({longer, shorter});
    const uint64_t first = mode == PlannerConfig::Mode::kSrtf ? shorter : longer;
    const uint64_t second = first == shorter ? longer : shorter;
    EXPECT_EQ(RunMode(first), "alone");
    EXPECT_EQ(Job(second).state, jobs::JobState::kQueued);
    ASSERT_TRUE(TickUntil([&] { return jobs::IsTerminal(Job(longer).state) && jobs::IsTerminal(Job(shorter).state); }));
    for (uint64_t id : {longer, shorter}) {
      EXPECT_EQ(Job(id).state, jobs::JobState::kCompleted) << Job(id).message;
      EXPECT_EQ(RunMode(id), "alone");
    }
  }
}

// Stop-loss: a spatial pairing is judged 2 epochs after it began
// against each member's metric at its start. Members that cannot improve
// (learning rate 1e-12: the accuracy does not move) are decoupled with the
// reason in the event log and each finishes its own run alone; members that
// learn (learning rate 0.003: the held-out loss falls) keep the pairing.
class JobRunnerStopLossTest : public JobRunnerTest {
 protected:
  PlannerConfig SpatialGains() {
    const std::string gains = StrCat(::testing::TempDir(), "/gains_spatial_", ::getpid(), ".csv");
    std::ofstream out(gains);
    out << "task_a,task_b,mode,gain\n"
           "fa-major,fa-inv,spatial,0.5\n";
    PlannerConfig p;
    p.mode = PlannerConfig::Mode::kYmir;
    p.gains_path = gains;
    return p;
  }
  static std::string Job3Epochs(const std::string& name, const std::string& task, const std::string& lr,
                                const std::string& stop) {
    return StrCat("name: ", name, "\nbackbone: tiny\ntrust_domain: lab\n",
                  "dataset: {synthetic: {task: ", task, ", seed: 3, examples: 80, sequence_length: 8}}\n",
                  "hyperparameters: {learning_rate: ", lr, ", batch_size: 8}\n", "stop: {", stop,
                  ", max_epochs: 3}\n");
  }
  bool AnyEventWith(uint64_t id, const std::string& part) {
    for (const JobEvent& e : Events(id)) {
      if (e.details_json.find(part) != std::string::npos) return true;
    }
    return false;
  }
};

TEST_F(JobRunnerStopLossTest, PairingThatDoesNotImproveIsDecoupledAndEachJobContinuesAlone) {
  StartDaemon(1, SpatialGains());
  NewRunner();
  const uint64_t a = Submit(Job3Epochs("a", "fa-major", "1e-12", "metric: accuracy, target: 0.999"));
  const uint64_t b = Submit(Job3Epochs("b", "fa-inv", "1e-12", "metric: accuracy, target: 0.999"));
  ProfileAndPlan({a, b});
  ASSERT_EQ(Job(a).plan.mode, jobs::RunMode::kSpatial) << Job(a).message;
  ASSERT_EQ(Job(b).plan.mode, jobs::RunMode::kSpatial) << Job(b).message;
  // Until the verdict (2 epochs = 16 iterations) the pair stays together.
  ASSERT_TRUE(TickUntil([&] { return Job(a).plan.mode != jobs::RunMode::kSpatial; }));
  std::vector<JobEvent> ev_a, ev_b;
  const JobEvent* da = FindEvent(a, "decoupled", &ev_a);
  const JobEvent* db = FindEvent(b, "decoupled", &ev_b);
  ASSERT_NE(da, nullptr);
  ASSERT_NE(db, nullptr);
  // One member was judged (the reason names the stop-loss), the other was
  // decoupled with it in the same transaction.
  const bool a_judged = da->details_json.find("stop-loss: the spatial pairing") != std::string::npos;
  const JobEvent* judged = a_judged ? da : db;
  const JobEvent* other = a_judged ? db : da;
  EXPECT_THAT(judged->details_json, HasSubstr("did not improve accuracy within 2 epochs"));
  EXPECT_THAT(judged->details_json, HasSubstr("at 2.00 epochs"));
  EXPECT_THAT(judged->details_json, HasSubstr("\"mode\":\"spatial\""));
  EXPECT_THAT(judged->details_json, HasSubstr("\"never_pair_again\":true"));  // stored: survives a restart
  EXPECT_EQ(*jobs_->NeverPairedAgain(), (std::set<std::pair<uint64_t, uint64_t>>{{std::min(a, b), std::max(a, b)}}));
  EXPECT_THAT(other->details_json, HasSubstr("was decoupled: stop-loss"));
  EXPECT_EQ(Job(a).plan.mode, jobs::RunMode::kAlone);
  EXPECT_EQ(Job(b).plan.mode, jobs::RunMode::kAlone);
  const int64_t at_verdict = std::max(runner_->TrainingPosition(a).first, runner_->TrainingPosition(b).first);
  EXPECT_GE(at_verdict, 16);
  // Each continues with its own progress to its own limit (3 epochs = 24
  // iterations), never paired again.
  ASSERT_TRUE(TickUntil([&] { return jobs::IsTerminal(Job(a).state) && jobs::IsTerminal(Job(b).state); }));
  for (uint64_t id : {a, b}) {
    const jobs::JobInfo j = Job(id);
    EXPECT_EQ(j.state, jobs::JobState::kCompleted) << j.message;
    EXPECT_EQ(j.iterations_done, 24) << "job " << id;
    std::vector<std::string> kinds = Kinds(id);
    const auto dec = std::find(kinds.begin(), kinds.end(), "decoupled");
    ASSERT_NE(dec, kinds.end());
    // Training went on after the decoupling (progress or checkpoints, then completion).
    EXPECT_NE(std::find(dec, kinds.end(), "completed"), kinds.end());
    int spatial_runs = 0;
    for (const JobEvent& e : Events(id)) {
      spatial_runs += (e.kind == "running" || e.kind == "replanned") &&
                      e.details_json.find("\"mode\":\"spatial\"") != std::string::npos;
    }
    EXPECT_EQ(spatial_runs, 1) << "job " << id << " was paired again";
  }
}

TEST_F(JobRunnerStopLossTest, PairingThatImprovesIsKept) {
  StartDaemon(1, SpatialGains());
  NewRunner();
  const uint64_t a = Submit(Job3Epochs("a", "fa-major", "0.003", "metric: loss, target: 0.0001"));
  const uint64_t b = Submit(Job3Epochs("b", "fa-inv", "0.003", "metric: loss, target: 0.0001"));
  ProfileAndPlan({a, b});
  ASSERT_EQ(Job(a).plan.mode, jobs::RunMode::kSpatial) << Job(a).message;
  // Kept: the second member judged records the verdict in its progress event.
  ASSERT_TRUE(TickUntil([&] {
    return AnyEventWith(a, "stop_loss_kept") || AnyEventWith(b, "stop_loss_kept") || jobs::IsTerminal(Job(a).state) ||
           jobs::IsTerminal(Job(b).state);
  }));
  ASSERT_TRUE(AnyEventWith(a, "stop_loss_kept") || AnyEventWith(b, "stop_loss_kept"));
  EXPECT_EQ(Job(a).plan.mode, jobs::RunMode::kSpatial);
  EXPECT_EQ(Job(b).plan.mode, jobs::RunMode::kSpatial);
  ASSERT_TRUE(TickUntil([&] { return jobs::IsTerminal(Job(a).state) && jobs::IsTerminal(Job(b).state); }));
  for (uint64_t id : {a, b}) {
    EXPECT_EQ(Job(id).state, jobs::JobState::kCompleted) << Job(id).message;
    EXPECT_FALSE(AnyEventWith(id, "stop-loss")) << "job " << id;
  }
}

// What the stop-loss tests above rest on: the planner prices the spatial
// pair from the two jobs' profiled iteration times t. With gain 0.5 the
// pair trains (1 - 0.5) x (24 + 24) joint iterations at the slower job's
// time, so its TranWt, (2 min(T_a, T_b) + max(T_a, T_b)) / (2 x joint) with
// T = 24 t, is 0.5 + t_fast / t_slow: once one job's time is more than
// twice the other's the candidate falls under the planner's bar
// (min_tran_wt 1), is pruned, and the jobs run one after the other. With
// real measurements a loaded machine can stretch one job's two timed
// profiling micro-batches that far; here each job's spans are set
// (JobRunnerOptions::span_seconds): 1.9x still pairs, 2.1x does not.
TEST_F(JobRunnerStopLossTest, SpatialPairIsPricedFromTheProfiledIterationTimes) {
  StartDaemon(1, SpatialGains());
  auto slower = std::make_shared<std::map<uint64_t, double>>();  // job -> factor on kMicroBatchS
  span_seconds_ = [slower](uint64_t job, int64_t waves, double) {
    return static_cast<double>(waves) * kMicroBatchS * (slower->contains(job) ? slower->at(job) : 1.0);
  };
  NewRunner();
  auto profiled = [&](uint64_t id) {
    std::vector<JobEvent> ev;
    const JobEvent* e = FindEventWith(id, "progress", "profiled_iter_time_s", &ev);
    if (e == nullptr) return std::nan("");
    const size_t at = e->details_json.find("\"profiled_iter_time_s\":");
    return std::stod(e->details_json.substr(at + 23));
  };
  const std::string stop = "metric: accuracy, target: 0.999";
  const uint64_t a = Submit(Job3Epochs("a", "fa-major", "1e-12", stop));
  const uint64_t b = Submit(Job3Epochs("b", "fa-inv", "1e-12", stop));
  (*slower)[b] = 1.9;  // TranWt 0.5 + 1 / 1.9 = 1.03
  ProfileAndPlan({a, b});
  EXPECT_DOUBLE_EQ(profiled(a), kMicroBatchS);
  EXPECT_DOUBLE_EQ(profiled(b), 1.9 * kMicroBatchS);
  EXPECT_EQ(Job(a).plan.mode, jobs::RunMode::kSpatial) << Job(a).message;
  EXPECT_EQ(Job(b).plan.mode, jobs::RunMode::kSpatial) << Job(b).message;
  ASSERT_TRUE(jobs_->Cancel(a, "next pair").ok());
  ASSERT_TRUE(jobs_->Cancel(b, "next pair").ok());

  const uint64_t c = Submit(Job3Epochs("c", "fa-major", "1e-12", stop));
  const uint64_t d = Submit(Job3Epochs("d", "fa-inv", "1e-12", stop));
  (*slower)[d] = 2.1;  // TranWt 0.5 + 1 / 2.1 = 0.98: pruned
  ProfileAndPlan({c, d});
  EXPECT_DOUBLE_EQ(profiled(c), kMicroBatchS);
  EXPECT_DOUBLE_EQ(profiled(d), 2.1 * kMicroBatchS);
  const jobs::JobInfo jc = Job(c), jd = Job(d);
  EXPECT_EQ(static_cast<int>(jc.state == jobs::JobState::kRunning) + static_cast<int>(jd.state == jobs::JobState::kRunning),
            1)
      << jc.message << " / " << jd.message;
  for (const jobs::JobInfo& j : {jc, jd}) {
    EXPECT_TRUE(j.state == jobs::JobState::kRunning || j.state == jobs::JobState::kQueued) << "job " << j.id;
    if (j.state == jobs::JobState::kRunning) {
      EXPECT_EQ(j.plan.mode, jobs::RunMode::kAlone) << "job " << j.id;
    }
  }
}

// Temporal A -> B: B runs as the pair's target (mode temporal, partner the
// completed A) from A's adapters; with a learning rate that cannot move its
// accuracy it is decoupled after 2 epochs and finishes alone with its own
// progress.
TEST_F(JobRunnerPairingTest, TemporalTargetThatDoesNotImproveIsDecoupled) {
  StartDaemon(1, WithGains(PlannerConfig::Mode::kYmir));
  NewRunner();
  const std::string frozen = "trust_domain: lab\n";
  auto job = [&](const std::string& name, const std::string& task) {
    return StrCat("name: ", name, "\nbackbone: tiny\n", frozen,
                  "dataset: {synthetic: {task: ", task, ", seed: 3, examples: 80, sequence_length: 8}}\n",
                  "hyperparameters: {learning_rate: 1e-12, batch_size: 8}\n",
                  "stop: {metric: accuracy, target: 0.999, max_epochs: 3}\n");
  };
  const uint64_t a = Submit(job("a", "fa-major"));
  const uint64_t b = Submit(job("b", "fa-inv"));
  ProfileAndPlan({a, b});
  const uint64_t source = RunMode(a) == "temporal" ? a : b, target = source == a ? b : a;
  ASSERT_EQ(RunMode(source), "temporal");
  ASSERT_TRUE(TickUntil([&] { return jobs::IsTerminal(Job(a).state) && jobs::IsTerminal(Job(b).state); }));
  EXPECT_EQ(Job(source).state, jobs::JobState::kCompleted) << Job(source).message;
  const jobs::JobInfo t = Job(target);
  EXPECT_EQ(t.state, jobs::JobState::kCompleted) << t.message;
  EXPECT_EQ(t.iterations_done, 24);  // its own 3 epochs, decoupled after 2
  EXPECT_EQ(RunMode(target), "temporal");  // ran as the pair's second half
  std::vector<JobEvent> ev;
  const JobEvent* run = FindEvent(target, "running", &ev);
  ASSERT_NE(run, nullptr);
  EXPECT_THAT(run->details_json, HasSubstr(StrCat("\"partner\":", source)));
  const JobEvent* dec = FindEvent(target, "decoupled", &ev);
  ASSERT_NE(dec, nullptr);
  EXPECT_THAT(dec->details_json, HasSubstr(StrCat("stop-loss: the temporal pairing with job ", source,
                                                  " did not improve accuracy within 2 epochs")));
  EXPECT_THAT(dec->details_json, HasSubstr("member 0 at 2.00 epochs"));
  // Decoupled, then training went on to completion.
  const std::vector<std::string> kinds = Kinds(target);
  const auto d = std::find(kinds.begin(), kinds.end(), "decoupled");
  ASSERT_NE(d, kinds.end());
  EXPECT_NE(std::find(d, kinds.end(), "completed"), kinds.end());
}

// Stop-loss of a temporal target against the normal curve.
// Job n trains fa-inv normally first (alone, from scratch,
// 3 epochs, loss evaluated at each epoch end); then source a (task and
// learning rate per test) -> target b (fa-inv, n's setup, another seed) runs
// temporally: b starts from a's trained adapters and is judged at 2 epochs
// against n's loss at b's step, not against its own loss at the pairing's
// start.
class JobRunnerTemporalCurveTest : public JobRunnerTest {
 protected:
  void SetUp() override {
    const std::string gains = StrCat(UniqueRunnerTestDir("gains"), "/gains.csv");
    std::ofstream out(gains);
    out << "task_a,task_b,mode,gain\n";
    for (const char* src : {"fa-major", "fa-noisy", "fb-major", "parity", "lm"}) out << src << ",fa-inv,temporal,0.9\n";
    out.close();
    PlannerConfig p;
    p.mode = PlannerConfig::Mode::kYmir;
    p.gains_path = gains;
    StartDaemon(1, p);
    NewRunner();
  }
  static std::string Spec(const std::string& name, const std::string& task, const std::string& lr, int seed) {
    return StrCat("name: ", name, "\nbackbone: tiny\ntrust_domain: lab\n",
                  "dataset: {synthetic: {task: ", task, ", seed: 3, examples: 80, sequence_length: 8}}\n",
                  "hyperparameters: {learning_rate: ", lr, ", batch_size: 8, seed: ", seed, "}\n",
                  "stop: {metric: loss, target: 0.0001, max_epochs: 3}\n");
  }
  static double Detail(const JobEvent& e, const std::string& name) {
    const std::string key = StrCat("\"", name, "\":");
    const size_t at = e.details_json.find(key);
    return at == std::string::npos ? NAN : std::stod(e.details_json.substr(at + key.size()));
  }
  // Runs n to completion; returns its eval loss per iteration.
  std::map<int64_t, double> NormalRun() {
    n_ = Submit(Spec("n", "fa-inv", "0.01", 1));
    EXPECT_TRUE(TickUntil([&] { return jobs::IsTerminal(Job(n_).state); }));
    std::map<int64_t, double> out;
    for (const JobEvent& e : Events(n_)) {
      const double it = Detail(e, "iterations_done"), m = Detail(e, "metric");
      if (e.kind == "progress" && !std::isnan(it) && !std::isnan(m)) out[static_cast<int64_t>(it)] = m;
    }
    return out;
  }
  // Submits source a and target b, runs both to the end; returns b's id
  // (a's in *source).
  uint64_t RunPair(const std::string& source_task, const std::string& source_lr, uint64_t* source) {
    const uint64_t a = Submit(Spec("a", source_task, source_lr, 7));
    const uint64_t b = Submit(Spec("b", "fa-inv", "0.01", 2));
    ProfileAndPlan({a, b});
    std::vector<JobEvent> ev;
    const JobEvent* run = FindEvent(a, "running", &ev);
    EXPECT_NE(run, nullptr);
    const bool a_first = run != nullptr && run->details_json.find("\"mode\":\"temporal\"") != std::string::npos;
    *source = a_first ? a : b;
    EXPECT_TRUE(TickUntil([&] { return jobs::IsTerminal(Job(a).state) && jobs::IsTerminal(Job(b).state); }));
    return a_first ? b : a;
  }
  uint64_t n_ = 0;
};

// Source fa-noisy (lr 0.01): b starts at loss ~1.16 and is at ~0.92 after
// 2 epochs, better than its start but worse than n's ~0.62: decoupled, with
// the normal run named as the reference.
TEST_F(JobRunnerTemporalCurveTest, TargetBetterThanItsStartButWorseThanTheNormalCurveIsDecoupled) {
  const std::map<int64_t, double> normal = NormalRun();
  ASSERT_TRUE(normal.contains(16));
  uint64_t a = 0;
  const uint64_t b = RunPair("fa-noisy", "0.01", &a);
  std::vector<JobEvent> ev;
  const JobEvent* judged = FindEventWith(b, "progress", "\"iterations_done\":16,", &ev);
  ASSERT_NE(judged, nullptr);
  const double start = Detail(*judged, "stop_loss_start_metric"), metric = Detail(*judged, "metric");
  EXPECT_LT(metric, start) << "better than at the pairing's start (the old reference would keep it)";
  EXPECT_GT(metric, normal.at(16));
  EXPECT_EQ(Detail(*judged, "stop_loss_normal_curve"), 1);
  EXPECT_EQ(Detail(*judged, "stop_loss_normal_run_job"), static_cast<double>(n_));
  EXPECT_NEAR(Detail(*judged, "stop_loss_reference"), normal.at(16), 1e-9 + 1e-6 * normal.at(16));
  std::vector<JobEvent> ev2;
  const JobEvent* dec = FindEvent(b, "decoupled", &ev2);
  ASSERT_NE(dec, nullptr);
  EXPECT_THAT(dec->details_json, HasSubstr(StrCat("stop-loss: the temporal pairing with job ", a)));
  EXPECT_THAT(dec->details_json, HasSubstr(StrCat("reference: the normal run of job ", n_, " at step 16")));
  EXPECT_EQ(Job(b).state, jobs::JobState::kCompleted) << Job(b).message;
  EXPECT_EQ(Job(b).iterations_done, 24);  // continued alone to its limit
}

// Source fa-major at lr 0.003: b ends its 2 epochs below n's curve (0.6204
// vs 0.6226 here: a small margin) and the pairing is kept.
TEST_F(JobRunnerTemporalCurveTest, TargetThatBeatsTheNormalCurveIsKept) {
  const std::map<int64_t, double> normal = NormalRun();
  ASSERT_TRUE(normal.contains(16));
  uint64_t a = 0;
  const uint64_t b = RunPair("fa-major", "0.003", &a);
  std::vector<JobEvent> ev;
  const JobEvent* judged = FindEventWith(b, "progress", "\"iterations_done\":16,", &ev);
  ASSERT_NE(judged, nullptr);
  EXPECT_LT(Detail(*judged, "metric"), normal.at(16));
  EXPECT_EQ(Detail(*judged, "stop_loss_normal_curve"), 1);
  EXPECT_EQ(Detail(*judged, "stop_loss_kept"), 1);
  std::vector<JobEvent> ev2;
  EXPECT_EQ(FindEvent(b, "decoupled", &ev2), nullptr);
  EXPECT_EQ(Job(b).state, jobs::JobState::kCompleted) << Job(b).message;
}

// Profiling: a submitted job is profiled with real training
// micro-batches before the planner sees it; the measured time is in the
// profiling job's progress event; its own training starts from scratch
// afterwards (the profile ran on a scratch copy). Timed as in the daemon
// (real elapsed times, no span_seconds): one job, no decision depends on it.
TEST_F(JobRunnerTest, SubmittedJobIsProfiledBeforeItIsQueued) {
  StartDaemon(1);
  span_seconds_ = nullptr;
  NewRunner();
  const uint64_t id = Submit(SyntheticJob("profile-me", "parity"));
  ASSERT_TRUE(runner_->Tick().ok());
  EXPECT_EQ(Job(id).state, jobs::JobState::kProfiling);
  EXPECT_EQ(Job(id).message, "profiling on 1 GPU");
  ASSERT_TRUE(TickUntil([&] { return Job(id).state != jobs::JobState::kProfiling; }));
  EXPECT_EQ(Job(id).state, jobs::JobState::kQueued);
  EXPECT_EQ(Job(id).iterations_target, 16);  // 64 train rows / 8 per iteration x 2 epochs
  EXPECT_EQ(runner_->stats().profile_steps, 3u);
  EXPECT_EQ(runner_->stats().steps_done, 0u);
  EXPECT_EQ(runner_->TrainingPosition(id).first, -1);  // no training state yet
  EXPECT_THAT(Kinds(id), ::testing::ElementsAre("submitted", "profiling", "progress", "queued"));
  std::vector<JobEvent> ev;
  const JobEvent* prof = FindEventWith(id, "progress", "profiled_iter_time_s", &ev);
  ASSERT_NE(prof, nullptr);
  EXPECT_THAT(prof->details_json, HasSubstr("\"profile_micro_batches\":3"));
  EXPECT_THAT(prof->details_json, HasSubstr("\"iterations_done\":0"));
  const size_t at = prof->details_json.find("\"profiled_iter_time_s\":");
  const double t = std::stod(prof->details_json.substr(at + 23));
  EXPECT_GT(t, 0.0);
  ASSERT_TRUE(TickUntil([&] { return jobs::IsTerminal(Job(id).state); }));
  EXPECT_EQ(Job(id).state, jobs::JobState::kCompleted) << Job(id).message;
  EXPECT_EQ(Job(id).iterations_done, 16);
  EXPECT_EQ(runner_->stats().steps_done, 16u);  // its own run: all 16 iterations from scratch
}

// Runtime reuse (job_runner.h, 6.): after a restart
// the data of a job waiting for its devices is prepared planner.prefetch
// (default 30 s) before the next planning round, not earlier, and not at its
// resume: its context switch then reports prepare_data_ms 0 (the prefetch's
// own time beside it as prefetched_data_ms), while the job resumed at the
// first round, without a prefetch, pays for its data in its switch. The parts
// add up to context_switch_ms.
TEST_F(JobRunnerTest, WaitingJobsDataIsPreparedAheadOfThePlannedResume) {
  PlannerConfig planner;
  ASSERT_EQ(planner.prefetch, Duration::Seconds(30));
  ASSERT_EQ(planner.interval, Duration::Seconds(120));
  StartDaemon(1, planner);
  NewRunner();
  const uint64_t a = Submit(SyntheticJob("prefetch-a", "fa-major", "", 400, 3));
  const uint64_t b = Submit(SyntheticJob("prefetch-b", "fb-major", "", 400, 3));
  ProfileAndPlan({a, b});
  ASSERT_TRUE(TickUntil([&] {
    return runner_->TrainingPosition(a).first >= 2 || runner_->TrainingPosition(b).first >= 2;
  }));
  runner_->Stop();
  runner_.reset();
  OpenJobs();  // the restart: both queued, nothing loaded
  ASSERT_EQ(Job(a).state, jobs::JobState::kQueued);
  ASSERT_EQ(Job(b).state, jobs::JobState::kQueued);
  NewRunner();
  const Timestamp t0 = clock_.Now();
  const size_t events_a = Events(a).size(), events_b = Events(b).size();
  ASSERT_TRUE(runner_->Tick().ok());  // the first round: one device, one job runs
  const bool a_runs = Job(a).state == jobs::JobState::kRunning;
  const uint64_t run = a_runs ? a : b, wait = a_runs ? b : a;
  ASSERT_EQ(Job(run).state, jobs::JobState::kRunning);
  ASSERT_EQ(Job(wait).state, jobs::JobState::kQueued);
  executor::TrainBatch x;
  EXPECT_FALSE(runner_->MicroBatchOf(wait, 0, &x)) << "prepared before the prefetch window";
  // The resumed job's first micro-batch ends (its switch is reported).
  const size_t events_before_restart = a_runs ? events_a : events_b;
  ASSERT_TRUE(TickUntil([&] {
    const std::vector<JobEvent> e = Events(run);
    for (size_t i = events_before_restart; i < e.size(); ++i) {
      if (e[i].kind == "progress" && e[i].details_json.find("context_switch_ms") != std::string::npos) return true;
    }
    return false;
  }));
  EXPECT_FALSE(runner_->MicroBatchOf(wait, 0, &x)) << "prepared before the prefetch window";
  clock_.SetTime(t0 + Duration::Seconds(89));  // the next round at t0 + 120: 31 s ahead
  ASSERT_TRUE(runner_->Tick().ok());
  EXPECT_FALSE(runner_->MicroBatchOf(wait, 0, &x)) << "prepared more than prefetch_s ahead";
  clock_.SetTime(t0 + Duration::Seconds(90));  // 30 s ahead
  ASSERT_TRUE(runner_->Tick().ok());
  EXPECT_TRUE(runner_->MicroBatchOf(wait, 0, &x)) << "not prepared prefetch_s ahead of the round";
  EXPECT_EQ(Job(wait).state, jobs::JobState::kQueued);
  ASSERT_TRUE(jobs_->Cancel(run, "make room").ok());
  clock_.SetTime(t0 + Duration::Seconds(120));  // the round: the waiting job resumes
  std::vector<JobEvent> ev;
  ASSERT_TRUE(TickUntil([&] { return FindEventWith(wait, "progress", "context_switch_ms", &ev) != nullptr; }));
  auto field = [](const std::string& json, const std::string& key) {
    const size_t at = json.find("\"" + key + "\":");
    return at == std::string::npos ? -1.0 : std::stod(json.substr(at + key.size() + 3));
  };
  const std::string w = FindEventWith(wait, "progress", "context_switch_ms", &ev)->details_json;
  EXPECT_EQ(field(w, "prepare_data_ms"), 0.0) << w;
  EXPECT_GT(field(w, "prefetched_data_ms"), 0.0) << w;
  EXPECT_GE(field(w, "load_checkpoint_ms"), 0.0) << w;
  EXPECT_GT(field(w, "first_step_ms"), 0.0) << w;
  EXPECT_NEAR(field(w, "context_switch_ms"), field(w, "load_checkpoint_ms") + field(w, "first_step_ms"), 1e-3) << w;
  // The job resumed at the first round prepared its data in its switch.
  std::vector<JobEvent> rev = Events(run);
  const JobEvent* switched = nullptr;
  for (size_t i = events_before_restart; i < rev.size() && switched == nullptr; ++i) {
    if (rev[i].kind == "progress" && rev[i].details_json.find("context_switch_ms") != std::string::npos) {
      switched = &rev[i];
    }
  }
  ASSERT_NE(switched, nullptr);
  const std::string r = switched->details_json;
  EXPECT_GT(field(r, "prepare_data_ms"), 0.0) << r;
  EXPECT_EQ(field(r, "prefetched_data_ms"), -1.0) << r;
  EXPECT_NEAR(field(r, "context_switch_ms"),
              field(r, "load_checkpoint_ms") + field(r, "prepare_data_ms") + field(r, "first_step_ms"), 1e-3)
      << r;
}

// Runtime reuse (job_runner.h, 6.): a job the
// planner preempts for a short one keeps its loaded data and its training
// state in memory on the resident backbone while paused, so when it runs
// again nothing is reloaded: its context switch is the first micro-batch
// alone (no load_checkpoint_ms, no prepare_data_ms), and it continues from
// the position it was paused at.
TEST_F(JobRunnerTest, PreemptedJobKeepsItsStateResidentAndResumesWithoutReloading) {
  StartDaemon(1);
  NewRunner();
  const uint64_t a = Submit(SyntheticJob("long", "fa-major", "", 400, 3));
  ProfileAndPlan({a});
  ASSERT_TRUE(TickUntil([&] { return runner_->TrainingPosition(a).first >= 2; }));
  const uint64_t b = Submit(SyntheticJob("short", "parity"));
  ASSERT_TRUE(TickUntil([&] { return Job(a).state == jobs::JobState::kPaused || jobs::IsTerminal(Job(b).state); }));
  ASSERT_EQ(Job(a).state, jobs::JobState::kPaused) << "the planner ran the short job after the long one";
  ASSERT_TRUE(TickUntil([&] { return Job(b).state == jobs::JobState::kRunning || jobs::IsTerminal(Job(b).state); }));
  // Paused: its data and its state stay loaded.
  executor::TrainBatch x;
  EXPECT_TRUE(runner_->MicroBatchOf(a, 0, &x)) << "the paused job's data was released";
  const size_t events_at_pause = Events(a).size();
  ASSERT_TRUE(TickUntil([&] { return jobs::IsTerminal(Job(b).state); }));
  // Still paused (the completion plans in the next pass), its micro-batch in
  // flight at the preemption long ended: where it stands.
  ASSERT_EQ(Job(a).state, jobs::JobState::kPaused);
  EXPECT_TRUE(runner_->MicroBatchOf(a, 0, &x)) << "the paused job's data was released";
  const auto paused_at = runner_->TrainingPosition(a);
  EXPECT_GE(paused_at.first, 2);
  ASSERT_TRUE(TickUntil([&] {
    const std::vector<JobEvent> e = Events(a);
    for (size_t i = events_at_pause; i < e.size(); ++i) {
      if (e[i].kind == "progress" && e[i].details_json.find("context_switch_ms") != std::string::npos) return true;
    }
    return false;
  }));
  const std::vector<JobEvent> e = Events(a);
  std::string sw;
  bool ran_again = false;
  for (size_t i = events_at_pause; i < e.size(); ++i) {
    ran_again |= e[i].kind == "running";
    if (sw.empty() && e[i].kind == "progress" && e[i].details_json.find("context_switch_ms") != std::string::npos) {
      sw = e[i].details_json;
    }
  }
  EXPECT_TRUE(ran_again);
  EXPECT_THAT(sw, HasSubstr("\"first_step_ms\""));
  EXPECT_THAT(sw, ::testing::Not(HasSubstr("load_checkpoint_ms"))) << sw;
  EXPECT_THAT(sw, ::testing::Not(HasSubstr("prepare_data_ms"))) << sw;
  // It went on from where it was paused (the switch is reported after its
  // first micro-batch since: one more at most).
  const size_t at = sw.find("\"iterations_done\":");
  ASSERT_NE(at, std::string::npos) << sw;
  const int64_t resumed = std::stoll(sw.substr(at + 18));
  EXPECT_GE(resumed, paused_at.first);
  EXPECT_LE(resumed, paused_at.first + 1);
}

// A job left profiling by a restart is profiled again.
TEST_F(JobRunnerTest, JobLeftProfilingByARestartIsProfiledAgain) {
  StartDaemon(1);
  NewRunner();
  const uint64_t id = Submit(SyntheticJob("reprofile", "parity"));
  ASSERT_TRUE(runner_->Tick().ok());
  ASSERT_EQ(Job(id).state, jobs::JobState::kProfiling);
  runner_->Stop();  // the "crash": the measurement in flight is lost
  runner_.reset();
  OpenJobs();
  EXPECT_EQ(Job(id).state, jobs::JobState::kSubmitted);
  NewRunner();
  ASSERT_TRUE(TickUntil([&] { return Job(id).state == jobs::JobState::kQueued; }));
  EXPECT_THAT(Kinds(id),
              ::testing::ElementsAre("submitted", "profiling", "recovered", "profiling", "progress", "queued"));
  std::vector<JobEvent> ev;
  ASSERT_NE(FindEventWith(id, "progress", "profiled_iter_time_s", &ev), nullptr);
  EXPECT_EQ(runner_->stats().profile_steps, 3u);
}

// The planner's device set bounds placement: micro-batches submitted with
// devices {1} run only on device 1 although device 0 is idle.
TEST_F(JobRunnerTest, TrainStepsStayInsideTheirDeviceSet) {
  StartDaemon(2);
  auto weights = master_->BackboneWeights("tiny-ft");
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto state = executor::TaskState::Init((*weights)->dims(), executor::LoraConfig{4, 8}, 2, 1);
  ASSERT_TRUE(state.ok()) << state.status();
  auto job = std::make_shared<executor::LlamaTrainJob>();
  {
    absl::MutexLock l(&job->mu);
    job->state = *state;
  }
  std::vector<int64_t> tokens(2 * 6, 3);
  auto batch = std::make_shared<executor::TrainBatch>();
  batch->tokens = executor::Tensor::FromInt64(tokens, {2, 6});
  batch->labels = *executor::LastPositionLabels(std::vector<int64_t>{0, 1}, 6);
  for (int k = 0; k < 4; ++k) {
    TrainStepArgs args{.deployment = "tiny-ft", .job = job, .batch = batch, .rows = 2, .tokens = 6, .rank = 4,
                       .head_outputs = 2, .devices = {1}};
    auto rec = master_->SubmitTrainStep(args);
    ASSERT_TRUE(rec.ok()) << rec.status();
    bool closed = false;
    size_t seen = 0;
    while (!closed) seen += (*rec)->WaitFrom(seen, absl::Seconds(30), &closed).size();
    EXPECT_EQ((*rec)->Last().state, InstanceState::kDone) << (*rec)->Last().message;
  }
  auto tl = master_->Timeline(Timestamp::Never(), Timestamp::Infinite(), 100000);
  ASSERT_TRUE(tl.ok());
  int ops = 0;
  for (const TimelineEntry& e : tl->result.events) {
    if (e.is_transfer()) continue;
    ++ops;
    EXPECT_EQ(e.device, 1) << e.name;
  }
  EXPECT_GT(ops, 0);
  // Outside the cluster: refused, naming the field.
  TrainStepArgs bad{.deployment = "tiny-ft", .job = job, .batch = batch, .rows = 2, .tokens = 6, .rank = 4,
                    .head_outputs = 2, .devices = {7}};
  auto r = master_->SubmitTrainStep(bad);
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("devices: 7"));
}

// A pair the stop-loss decoupled (JobManager::Decouple with
// never_pair_again) stays apart after a restart: the gains table would pair
// these two temporally (YmirPairsRelatedJobsTemporally), the new runner
// reads the stored pair and runs both alone.
TEST_F(JobRunnerPairingTest, PairDecoupledBeforeARestartIsNeverPairedAgain) {
  StartDaemon(1, WithGains(PlannerConfig::Mode::kYmir));
  const uint64_t a = Submit(SyntheticJob("a", "fa-major", "trust_domain: lab\n"));
  const uint64_t b = Submit(SyntheticJob("b", "fa-inv", "trust_domain: lab\n"));
  ASSERT_TRUE(jobs_->Queue(a).ok());
  ASSERT_TRUE(jobs_->Queue(b).ok());
  jobs::RunPlan plan;
  plan.devices = {0};
  plan.mode = jobs::RunMode::kTemporal;
  plan.partner = b;
  ASSERT_TRUE(jobs_->Run(a, plan).ok());
  ASSERT_TRUE(jobs_->Decouple(a, "stop-loss: (test)", {}, /*never_pair_again=*/true).ok());
  OpenJobs();  // the restart: a goes back to queued
  ASSERT_EQ(Job(a).state, jobs::JobState::kQueued);
  NewRunner();
  ASSERT_TRUE(TickUntil([&] { return jobs::IsTerminal(Job(a).state) && jobs::IsTerminal(Job(b).state); }));
  EXPECT_EQ(Job(a).state, jobs::JobState::kCompleted) << Job(a).message;
  EXPECT_EQ(Job(b).state, jobs::JobState::kCompleted) << Job(b).message;
  for (uint64_t id : {a, b}) {
    bool restarted = id == b;  // b never ran before the restart
    for (const JobEvent& e : Events(id)) {
      restarted |= e.kind == "recovered";
      if (!restarted || (e.kind != "running" && e.kind != "replanned")) continue;
      EXPECT_THAT(e.details_json, HasSubstr("\"mode\":\"alone\"")) << "job " << id << " was paired again";
    }
  }
}

// Data parallelism (server/job_runner_dp.h). Two jobs with the same data,
// seed and hyperparameters (gradient accumulation 2): one may use 2 devices
// (gpus.max 2), the other 1. The planner gives the first both devices, its
// iterations run as waves of 2 concurrent micro-batches, one per device;
// the state it ends with is bit-identical to the one-stream job's.
TEST_F(JobRunnerTest, DataParallelJobOnTwoDevicesEndsBitIdenticalToOneStream) {
  StartDaemon(2);
  NewRunner();
  const std::string hp = "hyperparameters: {learning_rate: 0.01, batch_size: 8, grad_accumulation: 2}\n";
  auto yaml = [&](const std::string& name, int max_gpus) {
    std::string y = SyntheticJob(name, "fa-major", StrCat("gpus: {min: 1, max: ", max_gpus, "}\n"), 80, 2);
    y.replace(y.find("hyperparameters:"), y.find("stop:") - y.find("hyperparameters:"), hp);
    return y;
  };
  const uint64_t dp = Submit(yaml("dp", 2));
  ProfileAndPlan({dp});
  ASSERT_EQ(Job(dp).state, jobs::JobState::kRunning) << Job(dp).message;
  EXPECT_EQ(Job(dp).plan.devices, (std::vector<uint32_t>{0, 1}));
  ASSERT_TRUE(TickUntil([&] { return jobs::IsTerminal(Job(dp).state); }));
  ASSERT_EQ(Job(dp).state, jobs::JobState::kCompleted) << Job(dp).message;
  EXPECT_EQ(Job(dp).iterations_done, 8);  // 64 rows / 16 per iteration x 2 epochs
  // Every wave had one micro-batch per device. Profiling ran on device 0
  // only, so operators on device 1 are the second stream's.
  auto tl = master_->Timeline(Timestamp::Never(), Timestamp::Infinite(), 1000000);
  ASSERT_TRUE(tl.ok());
  std::set<uint32_t> used;
  for (const TimelineEntry& e : tl->result.events) {
    if (!e.is_transfer()) used.insert(e.device);
  }
  EXPECT_EQ(used, (std::set<uint32_t>{0, 1}));
  EXPECT_EQ(runner_->stats().steps_done, 16u);  // 8 iterations x 2 micro-batches

  const uint64_t one = Submit(yaml("one", 1));
  ProfileAndPlan({one});
  ASSERT_EQ(Job(one).state, jobs::JobState::kRunning) << Job(one).message;
  EXPECT_EQ(Job(one).plan.devices.size(), 1u);
  ASSERT_TRUE(TickUntil([&] { return jobs::IsTerminal(Job(one).state); }));
  ASSERT_EQ(Job(one).state, jobs::JobState::kCompleted) << Job(one).message;

  auto dims = LlamaPreset("tiny");
  ASSERT_TRUE(dims.ok());
  auto a = executor::LoadTaskCheckpoint(Job(dp).checkpoint_path, *dims);
  auto b = executor::LoadTaskCheckpoint(Job(one).checkpoint_path, *dims);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->step, 8);
  EXPECT_EQ(b->step, 8);
  EXPECT_TRUE(BitEqual(a->params, b->params));
  EXPECT_TRUE(BitEqual(a->m, b->m));
  EXPECT_TRUE(BitEqual(a->v, b->v));
  EXPECT_EQ(Job(dp).last_loss, Job(one).last_loss);
}

// planner.time_lut + profile_from_lut: a job whose key the LUT measured is
// queued without profiling micro-batches, with the LUT's time; its measured
// iterations are folded back into the LUT file.
TEST_F(JobRunnerTest, ProfilingReadsTheTimeLutAndMeasuredIterationsGoBackIntoIt) {
  PlannerConfig p;
  p.time_lut_path = StrCat(UniqueRunnerTestDir("lut"), "/lut.csv");
  p.profile_from_lut = true;
  {
    ymir::TimeLut lut;
    ASSERT_TRUE(lut.Set(ymir::LutKey{.devices = 1, .grad_accum = 1, .local_batch = 8}, 0.125, 3).ok());
    ASSERT_TRUE(lut.Save(p.time_lut_path).ok());
  }
  StartDaemon(1, p);
  NewRunner();
  const uint64_t id = Submit(SyntheticJob("from-lut", "fa-major"));
  ASSERT_TRUE(TickUntil([&] { return Job(id).state != jobs::JobState::kSubmitted &&
                                     Job(id).state != jobs::JobState::kProfiling; }));
  EXPECT_EQ(runner_->stats().profile_steps, 0u);
  std::vector<JobEvent> ev;
  const JobEvent* prof = FindEventWith(id, "progress", "profiled_iter_time_s", &ev);
  ASSERT_NE(prof, nullptr);
  EXPECT_THAT(prof->details_json, HasSubstr("\"profiled_iter_time_s\":0.125"));
  EXPECT_THAT(prof->details_json, HasSubstr("\"profile_from_lut\":1"));
  EXPECT_THAT(prof->details_json, HasSubstr("\"profile_micro_batches\":0"));
  ASSERT_TRUE(TickUntil([&] { return jobs::IsTerminal(Job(id).state); }));
  EXPECT_EQ(Job(id).state, jobs::JobState::kCompleted) << Job(id).message;
  runner_->Stop();  // writes the LUT back
  auto lut = ymir::TimeLut::Load(p.time_lut_path);
  ASSERT_TRUE(lut.ok()) << lut.status();
  auto e = lut->entries().find(ymir::LutKey{.devices = 1, .grad_accum = 1, .local_batch = 8});
  ASSERT_NE(e, lut->entries().end());
  EXPECT_EQ(e->second.samples, 3 + 16);  // 16 measured iterations folded in
  EXPECT_NE(e->second.seconds, 0.125);
}

}  // namespace
}  // namespace slicesched
