// The fine-tuning job runner (server/job_runner.h) on a real Master with
// LibTorch CPU executors and a real JobManager: jobs run as "<dep>/train"
// instances through the operator-level scheduler, stop on their condition,
// checkpoint and resume exactly, fail with a reason, and the planner pairs
// only what may be paired. The planning clock is a ManualClock; the runner
// waits on instance records (condition waits), never sleeps.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "slicesched/common/clock.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/llama_kernels.h"
#include "slicesched/executor/train_ops.h"
#include "slicesched/jobs/job_manager.h"
#include "slicesched/server/config.h"
#include "slicesched/server/job_runner.h"
#include "slicesched/server/master.h"

namespace slicesched {
namespace {

using ::testing::HasSubstr;

std::string UniqueDir(const std::string& name) {
  static std::atomic<int> counter{0};
  std::string dir = StrCat(::testing::TempDir(), "/sliced_runner_", name, "_", ::getpid(), "_", counter++);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

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

class JobRunnerTest : public ::testing::Test {
 protected:
  void StartDaemon(int devices, PlannerConfig planner = {}) {
    dir_ = UniqueDir("t");
    auto c = ParseSlicedConfig(
        YAML::Load(StrCat("cluster:\n"
                          "  devices: [{name: cpu, count: ",
                          devices,
                          ", type: cpu, memory: 256MiB, backend: cpu}]\n"
                          "deployments:\n"
                          "  - {name: tiny-ft, model: tiny, weights: {seed: 5}, role: offline, partitions: [single]}\n"
                          "listen: {unix_socket: ", dir_, "/s.sock}\n"
                          "state_dir: ",
                          dir_, "/state\n")),
        "<test>");
    ASSERT_TRUE(c.ok()) << c.status();
    config_ = *c;
    MasterOptions mo;
    mo.estimator_save_interval = Duration::Seconds(3600);
    auto m = Master::Start(*c, mo);
    ASSERT_TRUE(m.ok()) << m.status();
    master_ = *std::move(m);
    planner_ = planner;
    OpenJobs();
  }
  void OpenJobs() {
    jobs_.reset();
    auto j = jobs::JobManager::Open(config_.state_dir, {});
    ASSERT_TRUE(j.ok()) << j.status();
    jobs_ = *std::move(j);
  }
  void NewRunner() {
    if (runner_) runner_->Stop();
    runner_.reset();
    JobRunnerOptions o;
    o.planner = planner_;
    o.state_dir = config_.state_dir;
    o.clock = &clock_;
    auto r = JobRunner::Create(master_.get(), jobs_.get(), o);
    ASSERT_TRUE(r.ok()) << r.status();
    runner_ = *std::move(r);
  }
  void TearDown() override {
    if (runner_) runner_->Stop();
    runner_.reset();
    jobs_.reset();
    if (master_) master_->Shutdown();
  }
  uint64_t Submit(const std::string& yaml) {
    auto r = jobs_->Submit(yaml, "", false);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->job_id : 0;
  }
  // Ticks until `done` holds (at most `max_ticks` passes).
  template <typename F>
  bool TickUntil(F done, int max_ticks = 20000) {
    for (int i = 0; i < max_ticks; ++i) {
      absl::Status s = runner_->Tick();
      EXPECT_TRUE(s.ok()) << s;
      if (!s.ok()) return false;
      if (done()) return true;
      runner_->WaitForProgress(absl::Seconds(2));
    }
    return false;
  }
  jobs::JobInfo Job(uint64_t id) { return *jobs_->Get(id); }
  std::vector<JobEvent> Events(uint64_t id) { return *jobs_->Events(id); }
  const JobEvent* FindEvent(uint64_t id, const std::string& kind, std::vector<JobEvent>* keep) {
    *keep = Events(id);
    for (const JobEvent& e : *keep) {
      if (e.kind == kind) return &e;
    }
    return nullptr;
  }

  std::string dir_;
  SlicedConfig config_;
  PlannerConfig planner_;
  ManualClock clock_;
  std::unique_ptr<Master> master_;
  std::unique_ptr<jobs::JobManager> jobs_;
  std::unique_ptr<JobRunner> runner_;
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
  const JobEvent* progress = FindEvent(id, "progress", &ev);
  ASSERT_NE(progress, nullptr);
  EXPECT_THAT(progress->details_json, HasSubstr("context_switch_ms"));
  EXPECT_THAT(progress->details_json, HasSubstr("first_step_ms"));
  const JobEvent* done = FindEvent(id, "completed", &ev);
  ASSERT_NE(done, nullptr);
  EXPECT_THAT(done->details_json, HasSubstr("\"censored\":1"));
  EXPECT_THAT(done->details_json, HasSubstr("\"accuracy\":"));
  EXPECT_FALSE(j.checkpoint_path.empty());
  EXPECT_TRUE(std::filesystem::exists(j.checkpoint_path));
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

// Pairing: with a gains table that makes fa-major -> fa-inv very useful and
// one device, Ymir runs the pair temporally; a job that opts out of sharing,
// or one of another trust domain, is never paired; the elastic fallback
// never pairs.
class JobRunnerPairingTest : public JobRunnerTest {
 protected:
  PlannerConfig WithGains(PlannerConfig::Mode mode) {
    const std::string gains = StrCat(::testing::TempDir(), "/gains_", ::getpid(), ".csv");
    std::ofstream out(gains);
    out << "task_a,task_b,mode,gain\n"
           "fa-major,fa-inv,temporal,0.9\n"
           "fa-inv,fa-major,temporal,0.9\n"
           "fa-major,fa-inv,spatial,-0.5\n";
    PlannerConfig p;
    p.mode = mode;
    p.gains_path = gains;
    return p;
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
  const uint64_t a = Submit(SyntheticJob("a", "fa-major", "trust_domain: lab\n"));
  const uint64_t b = Submit(SyntheticJob("b", "fa-inv", "trust_domain: lab\n"));
  ASSERT_TRUE(runner_->Tick().ok());
  const std::string ma = RunMode(a), mb = RunMode(b);
  ASSERT_TRUE(ma == "temporal" || mb == "temporal") << ma << " / " << mb;
  const uint64_t source = ma == "temporal" ? a : b, target = source == a ? b : a;
  EXPECT_EQ(Job(target).state, jobs::JobState::kQueued);  // waits for its source
  // The source completes; the target then starts from its adapters.
  ASSERT_TRUE(TickUntil([&] { return jobs::IsTerminal(Job(a).state) && jobs::IsTerminal(Job(b).state); }));
  EXPECT_EQ(Job(a).state, jobs::JobState::kCompleted) << Job(a).message;
  EXPECT_EQ(Job(b).state, jobs::JobState::kCompleted) << Job(b).message;
  std::vector<JobEvent> ev;
  const JobEvent* progress = FindEvent(target, "progress", &ev);
  ASSERT_NE(progress, nullptr);
  EXPECT_THAT(progress->details_json, HasSubstr(StrCat("\"temporal_source\":", source)));
}

TEST_F(JobRunnerPairingTest, OptOutAndOtherTrustDomainAreNeverPaired) {
  StartDaemon(1, WithGains(PlannerConfig::Mode::kYmir));
  NewRunner();
  const uint64_t a = Submit(SyntheticJob("a", "fa-major", "trust_domain: lab\n", 400, 3));
  const uint64_t b = Submit(SyntheticJob("b", "fa-inv", "trust_domain: lab\nallow_sharing: false\n", 400, 3));
  const uint64_t c = Submit(SyntheticJob("c", "fa-inv", "trust_domain: other\n", 400, 3));
  ASSERT_TRUE(runner_->Tick().ok());
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
  ASSERT_TRUE(runner_->Tick().ok());
  for (uint64_t id : {a, b}) {
    const std::string m = RunMode(id);
    EXPECT_TRUE(m == "" || m == "alone") << "job " << id << ": " << m;
  }
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

}  // namespace
}  // namespace slicesched
