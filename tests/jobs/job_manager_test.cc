// JobManager: submission, the legal and illegal transitions, pairing and
// decoupling, the event log (gapless, monotone), listing with filters and
// pages, and persistence across a reopen on the same state directory.
#include "slicesched/jobs/job_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <set>
#include <thread>

#include "slicesched/common/strings.h"

namespace slicesched::jobs {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  static std::atomic<int> counter{0};
  const std::string dir = StrCat(::testing::TempDir(), "/job_manager_test_", name, "_", ::getpid(), "_", counter++);
  std::filesystem::remove_all(dir);
  return dir;
}

// A valid job; `extra` lines are appended at the top level.
std::string JobYaml(const std::string& name, const std::string& extra = "") {
  return StrCat("name: ", name,
                "\n"
                "backbone: tiny\n"
                "dataset: {synthetic: {task: parity, seed: 1}}\n"
                "hyperparameters: {learning_rate: 0.001, batch_size: 8}\n"
                "stop: {metric: accuracy, target: 0.9, max_epochs: 2}\n"
                "gpus: {min: 1, max: 4}\n"
                "trust_domain: lab\n",
                extra);
}

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshDir("m");
    Open();
  }

  void Open() {
    manager_.reset();
    JobManager::Options o;
    o.now_unix_ms = [this] { return now_ms_.load(); };
    auto m = JobManager::Open(dir_, o);
    ASSERT_TRUE(m.ok()) << m.status();
    manager_ = *std::move(m);
  }

  uint64_t Submit(const std::string& name, const std::string& tenant = "", const std::string& extra = "") {
    auto r = manager_->Submit(JobYaml(name, extra), tenant, false);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->job_id : 0;
  }

  // A job that is queued, ready to run.
  uint64_t Queued(const std::string& name, const std::string& tenant = "", const std::string& extra = "") {
    const uint64_t id = Submit(name, tenant, extra);
    EXPECT_TRUE(manager_->Queue(id).ok());
    return id;
  }

  std::vector<std::string> Kinds(uint64_t id) {
    auto events = manager_->Events(id);
    EXPECT_TRUE(events.ok()) << events.status();
    std::vector<std::string> kinds;
    for (const JobEvent& e : *events) kinds.push_back(e.kind);
    return kinds;
  }

  // seq = 1, 2, ... and times never decrease.
  void ExpectGaplessLog(uint64_t id) {
    auto events = manager_->Events(id);
    ASSERT_TRUE(events.ok()) << events.status();
    int64_t last_time = 0;
    for (size_t i = 0; i < events->size(); ++i) {
      EXPECT_EQ((*events)[i].seq, i + 1) << "job " << id;
      EXPECT_EQ((*events)[i].job_id, id);
      EXPECT_GE((*events)[i].time_unix_ms, last_time);
      last_time = (*events)[i].time_unix_ms;
    }
  }

  std::string LastDetails(uint64_t id) {
    auto events = manager_->Events(id);
    EXPECT_TRUE(events.ok() && !events->empty());
    return events->back().details_json;
  }

  std::string dir_;
  std::atomic<int64_t> now_ms_{1'000'000};
  std::unique_ptr<JobManager> manager_;
};

RunPlan Alone(std::vector<uint32_t> devices) {
  RunPlan p;
  p.devices = std::move(devices);
  return p;
}

RunPlan Paired(std::vector<uint32_t> devices, RunMode mode, uint64_t partner, double gain) {
  RunPlan p;
  p.devices = std::move(devices);
  p.mode = mode;
  p.partner = partner;
  p.predicted_gain = gain;
  return p;
}

TEST_F(JobManagerTest, SubmitValidateOnlyAndInvalid) {
  auto v = manager_->Submit(JobYaml("a"), "team-a", /*validate_only=*/true);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->job_id, 0u);
  EXPECT_TRUE(manager_->List({})->jobs.empty());

  auto bad = manager_->Submit("name: x\nbackbone: nope\nhyperparameters: {batch_size: 0}\n", "", false);
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(bad.status().message());
  EXPECT_THAT(msg, HasSubstr("<job>:2:11: backbone: unknown backbone 'nope'"));
  EXPECT_THAT(msg, HasSubstr("<job>:3:31: hyperparameters.batch_size: must be at least 1, got 0"));
  EXPECT_THAT(msg, HasSubstr("hyperparameters: missing required field 'learning_rate'"));
  EXPECT_THAT(msg, HasSubstr("missing required field 'dataset'"));
  EXPECT_TRUE(manager_->List({})->jobs.empty());

  now_ms_ = 1'000'500;
  auto ok = manager_->Submit(JobYaml("a"), "team-a", false);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->job_id, 1u);
  auto job = manager_->Get(1);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->name, "a");
  EXPECT_EQ(job->tenant, "team-a");
  EXPECT_EQ(job->state, JobState::kSubmitted);
  EXPECT_EQ(job->yaml, JobYaml("a"));
  EXPECT_EQ(job->submitted_unix_ms, 1'000'500);
  EXPECT_EQ(job->spec.max_gpus, 4);
  EXPECT_THAT(Kinds(1), ElementsAre("submitted"));
  EXPECT_THAT(LastDetails(1), HasSubstr("\"backbone\":\"tiny\""));
  EXPECT_EQ(manager_->Get(2).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->Events(2).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobManagerTest, FullLifecycleWritesAGaplessLog) {
  const uint64_t id = Submit("a");
  auto step = [&](absl::StatusOr<JobInfo> r, JobState want) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->state, want);
    now_ms_ += 1000;
  };
  step(manager_->StartProfiling(id, {0}), JobState::kProfiling);
  step(manager_->ReportProgress(id, 5, 2.5, ""), JobState::kProfiling);
  step(manager_->Queue(id, 300), JobState::kQueued);
  step(manager_->Run(id, Alone({0, 1})), JobState::kRunning);
  step(manager_->ReportProgress(id, 100, 0.9, "/ckpt/a/100"), JobState::kRunning);
  step(manager_->Preempt(id, "online burst"), JobState::kPaused);
  step(manager_->Run(id, Alone({2})), JobState::kRunning);
  step(manager_->Run(id, Alone({2, 3})), JobState::kRunning);  // re-plan
  step(manager_->Pause(id, "planned out"), JobState::kPaused);
  step(manager_->Run(id, Alone({1})), JobState::kRunning);
  CompletionReport report;
  report.metrics = {{"accuracy", 0.93}, {"loss", 0.21}};
  report.checkpoint_path = "/ckpt/a/final";
  step(manager_->Complete(id, report), JobState::kCompleted);

  EXPECT_THAT(Kinds(id), ElementsAre("submitted", "profiling", "progress", "queued", "running", "checkpoint",
                                     "preempted", "running", "replanned", "paused", "running", "completed"));
  ExpectGaplessLog(id);
  auto job = manager_->Get(id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->iterations_done, 100);
  EXPECT_EQ(job->iterations_target, 300);
  EXPECT_DOUBLE_EQ(job->last_loss, 0.9);
  EXPECT_EQ(job->checkpoint_path, "/ckpt/a/final");
  EXPECT_EQ(job->message, "completed: accuracy=0.93, loss=0.21");
  EXPECT_TRUE(job->plan.devices.empty());
  EXPECT_THAT(LastDetails(id), HasSubstr("\"metrics\":{\"accuracy\":0.93,\"loss\":0.21}"));
  auto events = manager_->Events(id);
  EXPECT_THAT((*events)[4].details_json, HasSubstr("\"from\":\"queued\",\"to\":\"running\",\"mode\":\"alone\""));
  EXPECT_THAT((*events)[4].details_json, HasSubstr("\"devices\":[0,1],\"gpus\":2"));
  EXPECT_THAT((*events)[6].details_json, HasSubstr("\"reason\":\"online burst\""));
  EXPECT_THAT((*events)[7].details_json, HasSubstr("\"resume_from\":\"/ckpt/a/100\""));
  // Events after a given seq.
  auto tail = manager_->Events(id, 10);
  ASSERT_TRUE(tail.ok());
  ASSERT_EQ(tail->size(), 2u);
  EXPECT_EQ((*tail)[0].seq, 11u);
}

TEST_F(JobManagerTest, IllegalTransitionsNameBothStates) {
  const uint64_t id = Submit("a");
  auto expect_illegal = [&](absl::StatusOr<JobInfo> r, const std::string& from, const std::string& to) {
    ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(StrCat("job ", id, ": cannot go from ", from, " to ", to)));
  };
  expect_illegal(manager_->Run(id, Alone({0})), "submitted", "running");
  expect_illegal(manager_->Complete(id, {}), "submitted", "completed");
  expect_illegal(manager_->Pause(id, ""), "submitted", "paused");
  expect_illegal(manager_->Decouple(id, "x"), "submitted", "running");
  ASSERT_TRUE(manager_->Queue(id).ok());
  expect_illegal(manager_->StartProfiling(id, {}), "queued", "profiling");
  expect_illegal(manager_->Queue(id), "queued", "queued");
  expect_illegal(manager_->Preempt(id, ""), "queued", "paused");
  ASSERT_TRUE(manager_->Run(id, Alone({0})).ok());
  auto decouple = manager_->Decouple(id, "x");
  EXPECT_EQ(decouple.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(decouple.status().message(), HasSubstr("running alone"));
  ASSERT_TRUE(manager_->Fail(id, "executor crashed").ok());
  expect_illegal(manager_->Run(id, Alone({0})), "failed", "running");
  expect_illegal(manager_->Queue(id), "failed", "queued");
  expect_illegal(manager_->Fail(id, "again"), "failed", "failed");
  auto progress = manager_->ReportProgress(id, 1, 1, "");
  EXPECT_EQ(progress.status().code(), absl::StatusCode::kFailedPrecondition);
  // Refused calls leave no trace in the log.
  EXPECT_THAT(Kinds(id), ElementsAre("submitted", "queued", "running", "failed"));
  ExpectGaplessLog(id);
  EXPECT_EQ(manager_->Get(id)->message, "failed: executor crashed");
}

TEST_F(JobManagerTest, RunChecksThePlan) {
  const uint64_t a = Queued("a");
  EXPECT_EQ(manager_->Run(a, Alone({})).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(manager_->Run(a, Alone({1, 1})).status().code(), absl::StatusCode::kInvalidArgument);
  auto too_many = manager_->Run(a, Alone({0, 1, 2, 3, 4}));
  EXPECT_THAT(too_many.status().message(), HasSubstr("the plan gives 5 GPUs; the job takes 1..4"));
  RunPlan partnered = Alone({0});
  partnered.partner = 2;
  EXPECT_EQ(manager_->Run(a, partnered).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(manager_->Run(a, Paired({0}, RunMode::kSpatial, a, 0.1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(manager_->Run(a, Paired({0}, RunMode::kSpatial, 99, 0.1)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Kinds(a), ElementsAre("submitted", "queued"));
}

TEST_F(JobManagerTest, PairingNeedsConsentBackboneAndTrustDomain) {
  const uint64_t a = Queued("a");
  const uint64_t private_job = Queued("private", "", "allow_sharing: false\n");
  auto refused = manager_->Run(a, Paired({0}, RunMode::kTemporal, private_job, 0.2));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr(StrCat("job ", private_job, " does not allow sharing")));

  auto r = manager_->Submit(StrCat("name: small-job\nbackbone: small\n",
                                   "dataset: {synthetic: {task: parity, seed: 1}}\n"
                                   "hyperparameters: {learning_rate: 0.001, batch_size: 8}\n"
                                   "stop: {metric: accuracy, target: 0.9, max_epochs: 2}\n"
                                   "trust_domain: lab\n"),
                            "", false);
  ASSERT_TRUE(r.ok()) << r.status();
  auto backbone = manager_->Run(a, Paired({0}, RunMode::kSpatial, r->job_id, 0.2));
  EXPECT_THAT(backbone.status().message(), HasSubstr("has backbone 'small'"));

  std::string elsewhere = JobYaml("elsewhere");
  elsewhere.replace(elsewhere.find("trust_domain: lab"), 17, "trust_domain: other");
  auto t = manager_->Submit(elsewhere, "", false);
  ASSERT_TRUE(t.ok()) << t.status();
  auto domain = manager_->Run(a, Paired({0}, RunMode::kSpatial, t->job_id, 0.2));
  EXPECT_THAT(domain.status().message(), HasSubstr("is in trust domain 'other'"));
}

TEST_F(JobManagerTest, DecoupleSplitsBothJobsOfAPair) {
  const uint64_t a = Queued("a");
  const uint64_t b = Queued("b");
  ASSERT_TRUE(manager_->Run(a, Paired({0, 1}, RunMode::kSpatial, b, 0.3)).ok());
  auto rb = manager_->Run(b, Paired({0, 1}, RunMode::kSpatial, a, 0.3));
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ(rb->message, StrCat("running paired (spatial) with job ", a, " on 2 GPUs"));

  auto d = manager_->Decouple(a, "no accuracy gain in the first two epochs", -0.05);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->state, JobState::kRunning);
  EXPECT_EQ(d->plan.mode, RunMode::kAlone);
  EXPECT_EQ(d->plan.partner, 0u);
  EXPECT_THAT(LastDetails(a), HasSubstr("\"reason\":\"no accuracy gain in the first two epochs\""));
  EXPECT_THAT(LastDetails(a), HasSubstr("\"mode\":\"spatial\",\"predicted_gain\":0.3,\"actual_gain\":-0.05"));
  auto jb = manager_->Get(b);
  EXPECT_EQ(jb->plan.mode, RunMode::kAlone);
  EXPECT_THAT(Kinds(b), ElementsAre("submitted", "queued", "running", "decoupled"));
  EXPECT_THAT(LastDetails(b), HasSubstr(StrCat("\"reason\":\"partner job ", a, " was decoupled: no accuracy gain")));
  ExpectGaplessLog(a);
  ExpectGaplessLog(b);
}

// A decoupling with never_pair_again stores the pair in the same
// transaction; it is listed after a restart. A plain decoupling is not.
TEST_F(JobManagerTest, NeverPairAgainSurvivesARestart) {
  const uint64_t a = Queued("a");
  const uint64_t b = Queued("b");
  const uint64_t c = Queued("c");
  const uint64_t d = Queued("d");
  ASSERT_TRUE(manager_->Run(b, Paired({0}, RunMode::kSpatial, a, 0.3)).ok());
  ASSERT_TRUE(manager_->Run(a, Paired({0}, RunMode::kSpatial, b, 0.3)).ok());
  ASSERT_TRUE(manager_->Run(c, Paired({1}, RunMode::kSpatial, d, 0.3)).ok());
  ASSERT_TRUE(manager_->Run(d, Paired({1}, RunMode::kSpatial, c, 0.3)).ok());
  EXPECT_TRUE(manager_->NeverPairedAgain()->empty());
  ASSERT_TRUE(manager_->Decouple(b, "stop-loss: no gain", {}, /*never_pair_again=*/true).ok());
  ASSERT_TRUE(manager_->Decouple(c, "operator asked").ok());
  EXPECT_THAT(LastDetails(b), HasSubstr("\"never_pair_again\":true"));
  EXPECT_THAT(LastDetails(c), ::testing::Not(HasSubstr("never_pair_again")));
  const std::set<std::pair<uint64_t, uint64_t>> want = {{a, b}};
  EXPECT_EQ(*manager_->NeverPairedAgain(), want);
  Open();  // restart
  auto after = manager_->NeverPairedAgain();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, want);
  ExpectGaplessLog(a);
  ExpectGaplessLog(b);
}

// A spatial pair training jointly is stored with its "joint_training"
// events (both jobs, one transaction) and survives a restart (both jobs
// requeued, the pair still listed); EndJointTraining drops it with a
// "joint_not_resumed" event on each job. Any decoupling (Decouple, or a
// member leaving running) drops it too. Only a pair running spatially with
// each other can start joint training.
TEST_F(JobManagerTest, JointPairIsStoredUntilDecoupledAndSurvivesARestart) {
  const uint64_t a = Queued("a");
  const uint64_t b = Queued("b");
  const uint64_t c = Queued("c");
  const uint64_t d = Queued("d");
  EXPECT_EQ(manager_->StartJointTraining(a, b, 0, false).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(manager_->Run(a, Paired({0}, RunMode::kSpatial, b, 0.3)).ok());
  ASSERT_TRUE(manager_->Run(b, Paired({0}, RunMode::kSpatial, a, 0.3)).ok());
  ASSERT_TRUE(manager_->Run(c, Paired({1}, RunMode::kSpatial, d, 0.3)).ok());
  ASSERT_TRUE(manager_->Run(d, Paired({1}, RunMode::kSpatial, c, 0.3)).ok());
  EXPECT_TRUE(manager_->JointPairs()->empty());
  ASSERT_TRUE(manager_->StartJointTraining(b, a, 0, false).ok());
  ASSERT_TRUE(manager_->StartJointTraining(c, d, 0, false).ok());
  EXPECT_THAT(LastDetails(a), HasSubstr(StrCat("\"partner\":", b, ",\"step\":0,\"resumed\":false")));
  EXPECT_EQ(*manager_->JointPairs(), (std::set<std::pair<uint64_t, uint64_t>>{{a, b}, {c, d}}));
  // A member leaving running decouples its partner: no longer joint.
  ASSERT_TRUE(manager_->Pause(d, "operator").ok());
  EXPECT_EQ(*manager_->JointPairs(), (std::set<std::pair<uint64_t, uint64_t>>{{a, b}}));
  Open();  // restart: a and b requeued, still a stored joint pair
  EXPECT_EQ(manager_->Get(a)->state, JobState::kQueued);
  EXPECT_EQ(*manager_->JointPairs(), (std::set<std::pair<uint64_t, uint64_t>>{{a, b}}));
  ASSERT_TRUE(manager_->EndJointTraining(a, b, "checkpoints at different steps").ok());
  EXPECT_TRUE(manager_->JointPairs()->empty());
  for (uint64_t id : {a, b}) {
    EXPECT_EQ(Kinds(id).back(), "joint_not_resumed");
    EXPECT_THAT(LastDetails(id), HasSubstr("\"reason\":\"checkpoints at different steps\""));
    EXPECT_EQ(manager_->Get(id)->state, JobState::kQueued);
    ExpectGaplessLog(id);
  }
  // Decouple drops a resumed pair.
  ASSERT_TRUE(manager_->Run(a, Paired({0}, RunMode::kSpatial, b, 0.3)).ok());
  ASSERT_TRUE(manager_->Run(b, Paired({0}, RunMode::kSpatial, a, 0.3)).ok());
  ASSERT_TRUE(manager_->StartJointTraining(a, b, 3, true).ok());
  EXPECT_THAT(LastDetails(b), HasSubstr("\"step\":3,\"resumed\":true"));
  EXPECT_EQ(manager_->JointPairs()->size(), 1u);
  ASSERT_TRUE(manager_->Decouple(a, "re-plan").ok());
  EXPECT_TRUE(manager_->JointPairs()->empty());
}

TEST_F(JobManagerTest, LeavingRunningDecouplesThePartner) {
  const uint64_t a = Queued("a");
  const uint64_t b = Queued("b");
  ASSERT_TRUE(manager_->Run(a, Paired({0}, RunMode::kTemporal, b, 0.4)).ok());
  ASSERT_TRUE(manager_->Run(b, Paired({1}, RunMode::kTemporal, a, 0.4)).ok());
  auto c = manager_->Cancel(a, "user asked");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->state, JobState::kCancelled);
  EXPECT_EQ(manager_->Get(b)->plan.mode, RunMode::kAlone);
  EXPECT_THAT(LastDetails(b), HasSubstr(StrCat("partner job ", a, " cancelled")));
  // Completing a paired job records the pairing and the measured gain.
  const uint64_t x = Queued("x");
  const uint64_t y = Queued("y");
  ASSERT_TRUE(manager_->Run(x, Paired({2}, RunMode::kSpatial, y, 0.25)).ok());
  ASSERT_TRUE(manager_->Run(y, Paired({2}, RunMode::kSpatial, x, 0.25)).ok());
  CompletionReport r;
  r.metrics = {{"accuracy", 0.9}};
  r.actual_gain = 0.2;
  ASSERT_TRUE(manager_->Complete(x, r).ok());
  EXPECT_THAT(LastDetails(x), HasSubstr(StrCat("\"mode\":\"spatial\",\"partner\":", y)));
  EXPECT_THAT(LastDetails(x), HasSubstr("\"predicted_gain\":0.25,\"actual_gain\":0.2"));
  EXPECT_THAT(Kinds(y), ElementsAre("submitted", "queued", "running", "decoupled"));
}

TEST_F(JobManagerTest, CancelIsIdempotentOnTerminalJobs) {
  const uint64_t a = Queued("a");
  auto c1 = manager_->Cancel(a, "no longer needed");
  ASSERT_TRUE(c1.ok());
  EXPECT_EQ(c1->state, JobState::kCancelled);
  EXPECT_EQ(c1->message, "cancelled: no longer needed");
  auto c2 = manager_->Cancel(a, "again");
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ(c2->state, JobState::kCancelled);
  EXPECT_THAT(Kinds(a), ElementsAre("submitted", "queued", "cancelled"));

  const uint64_t b = Queued("b");
  ASSERT_TRUE(manager_->Run(b, Alone({0})).ok());
  ASSERT_TRUE(manager_->Complete(b, {}).ok());
  auto c3 = manager_->Cancel(b, "too late");
  ASSERT_TRUE(c3.ok());
  EXPECT_EQ(c3->state, JobState::kCompleted);
  EXPECT_THAT(Kinds(b), ElementsAre("submitted", "queued", "running", "completed"));
  EXPECT_EQ(manager_->Cancel(77, "").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobManagerTest, ListFiltersAndPages) {
  // ids 1..7: tenants a,b alternate; 2 and 5 run, 6 is cancelled.
  for (int i = 1; i <= 7; ++i) Submit(StrCat("j", i), i % 2 == 1 ? "a" : "b");
  ASSERT_TRUE(manager_->Queue(2).ok());
  ASSERT_TRUE(manager_->Run(2, Alone({0})).ok());
  ASSERT_TRUE(manager_->Queue(5).ok());
  ASSERT_TRUE(manager_->Run(5, Alone({1})).ok());
  ASSERT_TRUE(manager_->Cancel(6, "").ok());

  auto ids = [](const ListJobsPage& p) {
    std::vector<uint64_t> out;
    for (const JobInfo& j : p.jobs) out.push_back(j.id);
    return out;
  };
  auto all = manager_->List({});
  ASSERT_TRUE(all.ok());
  EXPECT_THAT(ids(*all), ElementsAre(1, 2, 3, 4, 5, 6, 7));
  EXPECT_EQ(all->next_page_token, "");

  ListJobsQuery q;
  q.tenant = "a";
  EXPECT_THAT(ids(*manager_->List(q)), ElementsAre(1, 3, 5, 7));
  q.states = {JobState::kRunning};
  EXPECT_THAT(ids(*manager_->List(q)), ElementsAre(5));
  q.tenant = "";
  q.states = {JobState::kSubmitted, JobState::kCancelled};
  EXPECT_THAT(ids(*manager_->List(q)), ElementsAre(1, 3, 4, 6, 7));

  // Pages of 2 over the submitted/cancelled jobs: [1,3] [4,6] [7].
  q.page_size = 2;
  auto p1 = manager_->List(q);
  ASSERT_TRUE(p1.ok());
  EXPECT_THAT(ids(*p1), ElementsAre(1, 3));
  ASSERT_NE(p1->next_page_token, "");
  q.page_token = p1->next_page_token;
  auto p2 = manager_->List(q);
  ASSERT_TRUE(p2.ok()) << p2.status();
  EXPECT_THAT(ids(*p2), ElementsAre(4, 6));
  q.page_token = p2->next_page_token;
  auto p3 = manager_->List(q);
  ASSERT_TRUE(p3.ok());
  EXPECT_THAT(ids(*p3), ElementsAre(7));
  EXPECT_EQ(p3->next_page_token, "");
  // An exact fit ends without an empty extra page.
  ListJobsQuery exact;
  exact.page_size = 7;
  EXPECT_EQ(manager_->List(exact)->next_page_token, "");

  // A token only works with the filters it came from.
  ListJobsQuery other;
  other.tenant = "b";
  other.page_token = p1->next_page_token;
  auto mismatch = manager_->List(other);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatch.status().message(), HasSubstr("other filters"));
  other.page_token = "garbage";
  EXPECT_THAT(manager_->List(other).status().message(), HasSubstr("is not a ListJobs page token"));

  const JobCounts c = manager_->Counts();
  EXPECT_EQ(c.submitted, 4u);
  EXPECT_EQ(c.running, 2u);
  EXPECT_EQ(c.cancelled, 1u);
}

TEST_F(JobManagerTest, RestartLosesNoJobAndRequeuesRunningOnes) {
  const uint64_t running = Queued("running");
  ASSERT_TRUE(manager_->Run(running, Alone({0, 1})).ok());
  ASSERT_TRUE(manager_->ReportProgress(running, 250, 0.4, "/ckpt/running/250").ok());
  const uint64_t profiling = Submit("profiling");
  ASSERT_TRUE(manager_->StartProfiling(profiling, {3}).ok());
  const uint64_t paused = Queued("paused");
  ASSERT_TRUE(manager_->Run(paused, Alone({2})).ok());
  ASSERT_TRUE(manager_->ReportProgress(paused, 10, 1.5, "/ckpt/paused/10").ok());
  ASSERT_TRUE(manager_->Preempt(paused, "online burst").ok());
  const uint64_t done = Queued("done");
  ASSERT_TRUE(manager_->Run(done, Alone({3})).ok());
  ASSERT_TRUE(manager_->Complete(done, {}).ok());
  const uint64_t waiting = Submit("waiting");
  const size_t running_events = Kinds(running).size();

  now_ms_ += 60'000;
  Open();  // the daemon restarts on the same state directory

  auto all = manager_->List({});
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->jobs.size(), 5u);
  auto r = manager_->Get(running);
  EXPECT_EQ(r->state, JobState::kQueued);
  EXPECT_EQ(r->checkpoint_path, "/ckpt/running/250");
  EXPECT_EQ(r->iterations_done, 250);
  EXPECT_DOUBLE_EQ(r->last_loss, 0.4);
  EXPECT_EQ(r->message, "queued after a restart (was running); resumes from /ckpt/running/250");
  EXPECT_TRUE(r->plan.devices.empty());
  EXPECT_EQ(r->updated_unix_ms, now_ms_.load());
  EXPECT_EQ(r->spec.name, "running");
  auto events = manager_->Events(running);
  ASSERT_EQ(events->size(), running_events + 1);
  EXPECT_EQ(events->back().kind, "recovered");
  EXPECT_THAT(events->back().details_json,
              HasSubstr("\"from\":\"running\",\"to\":\"queued\",\"checkpoint\":\"/ckpt/running/250\""));
  EXPECT_THAT(events->back().details_json, HasSubstr("\"plan\":{\"mode\":\"alone\",\"partner\":0,\"devices\":[0,1]"));
  // A job left profiling is profiled again: back to submitted.
  EXPECT_EQ(manager_->Get(profiling)->state, JobState::kSubmitted);
  EXPECT_EQ(manager_->Get(profiling)->message, "submitted after a restart (was profiling); will be profiled again");
  EXPECT_THAT(Kinds(profiling), ElementsAre("submitted", "profiling", "recovered"));
  EXPECT_THAT(manager_->Events(profiling)->back().details_json,
              HasSubstr("\"from\":\"profiling\",\"to\":\"submitted\""));
  EXPECT_EQ(manager_->Get(paused)->state, JobState::kPaused);
  EXPECT_EQ(manager_->Get(paused)->checkpoint_path, "/ckpt/paused/10");
  EXPECT_EQ(manager_->Get(paused)->message, "preempted: online burst");
  EXPECT_EQ(manager_->Get(done)->state, JobState::kCompleted);
  EXPECT_EQ(manager_->Get(waiting)->state, JobState::kSubmitted);
  EXPECT_EQ(manager_->Get(waiting)->message, "submitted; waiting to be profiled");
  for (const JobInfo& j : all->jobs) ExpectGaplessLog(j.id);

  // The recovered job runs on and its log continues without a gap; a second
  // restart has nothing to recover.
  ASSERT_TRUE(manager_->Run(running, Alone({1})).ok());
  ASSERT_TRUE(manager_->Pause(running, "").ok());
  Open();
  EXPECT_EQ(manager_->Get(running)->state, JobState::kPaused);
  EXPECT_THAT(Kinds(profiling), ElementsAre("submitted", "profiling", "recovered"));
  ExpectGaplessLog(running);
  // Ids are never reused.
  EXPECT_EQ(Submit("new"), waiting + 1);
}

TEST_F(JobManagerTest, ConcurrentCallersKeepLogsGapless) {
  constexpr int kThreads = 4;
  constexpr int kJobsPerThread = 8;
  std::vector<std::thread> threads;
  std::vector<std::vector<uint64_t>> ids(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kJobsPerThread; ++i) {
        auto r = manager_->Submit(JobYaml(StrCat("t", t, "-", i)), StrCat("tenant", t), false);
        if (!r.ok()) continue;
        ids[t].push_back(r->job_id);
        (void)manager_->Queue(r->job_id);
        (void)manager_->Run(r->job_id, Alone({static_cast<uint32_t>(t)}));
        (void)manager_->Cancel(r->job_id, "done");
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::set<uint64_t> unique;
  for (const auto& v : ids) unique.insert(v.begin(), v.end());
  EXPECT_EQ(unique.size(), static_cast<size_t>(kThreads * kJobsPerThread));
  for (uint64_t id : unique) {
    EXPECT_THAT(Kinds(id), ElementsAre("submitted", "queued", "running", "cancelled"));
    ExpectGaplessLog(id);
  }
}

// A job stored by a sliced that read `allow_sharing: 'yes'` as true (before
// quoted words were refused) or `batch_size: "16"` as 16 (before quoted
// numbers were) reloads as it was accepted; a new submission with the same
// YAML is refused, naming each key and value.
TEST(JobManagerReload, QuotedScalarsOfStoredJobsStillRead) {
  const std::string dir = FreshDir("quoted");
  std::string yaml = JobYaml("old", "allow_sharing: 'no'\n");
  const std::string numbers = "{learning_rate: 0.001, batch_size: 8}";
  ASSERT_NE(yaml.find(numbers), std::string::npos);
  yaml.replace(yaml.find(numbers), numbers.size(), "{learning_rate: '0.002', batch_size: \"16\"}");
  {
    auto store = StateStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->CreateJob(yaml, "t", "queued").ok());
  }
  auto m = JobManager::Open(dir, {});
  ASSERT_TRUE(m.ok()) << m.status();
  auto old = (*m)->Get(1);
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->state, JobState::kQueued) << old->message;
  EXPECT_FALSE(old->spec.allow_sharing);
  EXPECT_EQ(old->spec.hyperparameters.batch_size, 16);
  EXPECT_DOUBLE_EQ(old->spec.hyperparameters.learning_rate, 0.002);
  auto fresh = (*m)->Submit(yaml, "t", false);
  ASSERT_FALSE(fresh.ok());
  EXPECT_THAT(fresh.status().message(),
              HasSubstr("allow_sharing: expected true or false, got the string 'no' (a quoted word is not a boolean"));
  EXPECT_THAT(fresh.status().message(),
              HasSubstr("hyperparameters.batch_size: expected an integer, got the string '16' (a quoted number is "
                        "not a number; write it without quotes)"));
  EXPECT_THAT(fresh.status().message(),
              HasSubstr("hyperparameters.learning_rate: expected a number, got the string '0.002' (a quoted "
                        "number is not a number"));
}

// Rows this binary cannot use (an unknown state, YAML that no longer parses)
// fail the job at reload instead of failing the daemon.
TEST(JobManagerReload, UnusableRowsFailTheJobNotTheDaemon) {
  const std::string dir = FreshDir("reload");
  {
    auto store = StateStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->CreateJob("name: [unclosed\n", "t", "queued").ok());
    ASSERT_TRUE((*store)->CreateJob(JobYaml("odd"), "t", "hibernating").ok());
    ASSERT_TRUE((*store)->CreateJob("name: [unclosed\n", "t", "completed").ok());
  }
  auto m = JobManager::Open(dir, {});
  ASSERT_TRUE(m.ok()) << m.status();
  auto bad_yaml = (*m)->Get(1);
  ASSERT_TRUE(bad_yaml.ok());
  EXPECT_EQ(bad_yaml->state, JobState::kFailed);
  EXPECT_THAT(bad_yaml->message, HasSubstr("failed at restart: the job's YAML no longer parses: <job>:"));
  auto odd = (*m)->Get(2);
  EXPECT_EQ(odd->state, JobState::kFailed);
  EXPECT_THAT(odd->message, HasSubstr("stored state 'hibernating' is unknown"));
  EXPECT_EQ(odd->name, "odd");
  EXPECT_EQ((*m)->Get(3)->state, JobState::kCompleted);  // finished jobs are left alone
  auto events = (*m)->Events(2);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ(events->back().kind, "failed");
  EXPECT_THAT(events->back().details_json, HasSubstr("\"from\":\"hibernating\",\"to\":\"failed\""));
  EXPECT_EQ((*m)->Events(3)->size(), 1u);
}

}  // namespace
}  // namespace slicesched::jobs
