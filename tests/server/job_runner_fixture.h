// The fixture shared by the job runner's tests (job_runner_test.cc,
// job_runner_spatial_test.cc): a real Master with LibTorch CPU executors on
// `devices` CPU devices (one offline deployment "tiny-ft", preset tiny,
// weights seed 5, partition single), a real JobManager on the state
// directory, and a JobRunner on a ManualClock. The runner waits on instance
// records (condition waits), never sleeps.
//
// No planning input comes from real time: the JobManager's timestamps (so a
// job's submission time and the waited_s the planner sees) are read from
// the ManualClock, and every timed span of training (a profiling
// micro-batch, a wave, an iteration; JobRunnerOptions::span_seconds) lasts
// kMicroBatchS per wave, so profiled and measured iteration times are
// kMicroBatchS x grad_accumulation however loaded the machine is. Before
// NewRunner a test may set span_seconds_ (other times per job; null: the
// real elapsed times, as in the daemon).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "slicesched/common/clock.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/train/train_ops.h"
#include "slicesched/jobs/job_manager.h"
#include "slicesched/server/config.h"
#include "slicesched/server/job_runner.h"
#include "slicesched/server/master.h"

namespace slicesched {

// A fresh, empty directory under the test temporary directory.
inline std::string UniqueRunnerTestDir(const std::string& name) {
  static std::atomic<int> counter{0};
  std::string dir = StrCat(::testing::TempDir(), "/sliced_runner_", name, "_", ::getpid(), "_", counter++);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Bit-exact equality of two jobs' adapters (every named tensor, shape and
// value) and of two whole training states (step, accumulation, parameters,
// AdamW moments, accumulated gradients while any are held).
inline bool BitEqual(const executor::TaskAdapters& a, const executor::TaskAdapters& b) {
  const auto na = a.NamedTensors(), nb = b.NamedTensors();
  if (na.size() != nb.size()) return false;
  for (size_t i = 0; i < na.size(); ++i) {
    if (na[i].first != nb[i].first || na[i].second.shape() != nb[i].second.shape() ||
        na[i].second.ToFloat() != nb[i].second.ToFloat()) {
      return false;
    }
  }
  return true;
}

inline bool BitEqual(const executor::TaskState& a, const executor::TaskState& b) {
  return a.step == b.step && a.accumulated == b.accumulated && BitEqual(a.params, b.params) &&
         BitEqual(a.m, b.m) && BitEqual(a.v, b.v) && (a.accumulated == 0 || BitEqual(a.grad_sum, b.grad_sum));
}

class JobRunnerFixture : public ::testing::Test {
 protected:
  static constexpr int64_t kUnixEpochMs = 1'700'000'000'000;  // the ManualClock's epoch as Unix time
  static constexpr double kMicroBatchS = 0.04;  // about an idle run's profiled time here

  JobRunnerFixture() {
    jobs_options_.now_unix_ms = [this] { return kUnixEpochMs + clock_.Now().nanos() / 1'000'000; };
  }

  // Starts the master on a new directory (dir_); no JobManager or runner yet.
  void StartMaster(const std::string& name, int devices) {
    dir_ = UniqueRunnerTestDir(name);
    auto c = ParseSlicedConfig(
        YAML::Load(StrCat("cluster:\n"
                          "  devices: [{name: cpu, count: ",
                          devices,
                          ", type: cpu, memory: 256MiB, backend: cpu}]\n"
                          "deployments:\n"
                          "  - {name: tiny-ft, model: tiny, weights: {seed: 5}, role: offline, partitions: [single]}\n"
                          "listen: {unix_socket: ",
                          dir_, "/s.sock}\nstate_dir: ", dir_, "/state\n")),
        "<test>");
    ASSERT_TRUE(c.ok()) << c.status();
    config_ = *c;
    MasterOptions mo;
    mo.estimator_save_interval = Duration::Seconds(3600);
    auto m = Master::Start(*c, mo);
    ASSERT_TRUE(m.ok()) << m.status();
    master_ = *std::move(m);
  }
  void OpenJobs() {
    jobs_.reset();
    auto j = jobs::JobManager::Open(config_.state_dir, jobs_options_);
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
    o.span_seconds = span_seconds_;
    auto r = JobRunner::Create(master_.get(), jobs_.get(), o);
    ASSERT_TRUE(r.ok()) << r.status();
    runner_ = *std::move(r);
  }
  void TearDown() override { StopDaemon(); }
  // Stops the runner, the jobs and the master (a test that starts another
  // daemon in its own state directory calls it first).
  void StopDaemon() {
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
  // Ticks until no job of `ids` is submitted or profiling any more, then
  // once more: the planning round their queueing requested.
  void ProfileAndPlan(std::initializer_list<uint64_t> ids) {
    ASSERT_TRUE(TickUntil([&] {
      for (uint64_t id : ids) {
        const jobs::JobState s = Job(id).state;
        if (s == jobs::JobState::kSubmitted || s == jobs::JobState::kProfiling) return false;
      }
      return true;
    }));
    ASSERT_TRUE(runner_->Tick().ok());
  }

  std::string dir_;
  SlicedConfig config_;
  PlannerConfig planner_;
  jobs::JobManager::Options jobs_options_;  // of the next OpenJobs
  ManualClock clock_;
  std::function<double(uint64_t, int64_t, double)> span_seconds_ = [](uint64_t, int64_t waves, double) {
    return static_cast<double>(waves) * kMicroBatchS;
  };
  std::unique_ptr<Master> master_;
  std::unique_ptr<jobs::JobManager> jobs_;
  std::unique_ptr<JobRunner> runner_;
};

}  // namespace slicesched
