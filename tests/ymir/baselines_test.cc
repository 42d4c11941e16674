#include "slicesched/ymir/baselines.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

namespace slicesched::ymir {
namespace {

// A job of `remaining` iterations whose iteration takes t1 seconds on one
// GPU and t1 / speedup[g] on g GPUs (g = 1..max_gpus).
JobView Job(uint64_t id, double remaining, double t1, int max_gpus = 1, std::vector<double> speedup = {},
            double waited_s = 0) {
  JobView v;
  v.id = id;
  v.remaining_iterations = remaining;
  v.min_gpus = 1;
  v.max_gpus = max_gpus;
  v.iter_time_s.assign(static_cast<size_t>(max_gpus) + 1, 0.0);
  for (int g = 1; g <= max_gpus; ++g) {
    const double s = static_cast<size_t>(g) <= speedup.size() ? speedup[static_cast<size_t>(g) - 1] : 1.0;
    v.iter_time_s[static_cast<size_t>(g)] = t1 / s;
  }
  v.waited_s = waited_s;
  return v;
}

std::map<uint64_t, int> GpusOf(const PlanResult& plan) {
  std::map<uint64_t, int> out;
  for (const Assignment& a : plan.assignments) {
    EXPECT_EQ(a.jobs.size(), 1u);
    EXPECT_EQ(a.mode == Mode::kNormal, a.gpus > 0);
    out[a.jobs[0]] = a.gpus;
  }
  return out;
}

// SRTF runs the jobs with the least remaining time (iterations x time per
// iteration, not iterations alone) on their gpus.min and makes the others
// wait, whatever their arrival or whether they run now; ties go to the
// lower id.
TEST(BaselinesTest, SrtfRunsTheShortestRemainingTimesFirst) {
  std::vector<JobView> jobs = {Job(1, 100, 1.0, 1, {}, 50), Job(2, 300, 0.1, 1, {}, 0), Job(3, 40, 1.0),
                               Job(4, 30, 1.0)};
  jobs[0].has_progress = true;  // running: SRTF preempts it all the same
  auto plan = PlanSrtf(jobs, ClusterView{.gpus = 2, .gpus_per_node = 2});
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Remaining times: 100, 30, 40, 30 s.
  EXPECT_EQ(GpusOf(*plan), (std::map<uint64_t, int>{{1, 0}, {2, 1}, {3, 0}, {4, 1}}));
  for (const Assignment& a : plan->assignments) {
    if (a.jobs[0] == 2) {
      EXPECT_DOUBLE_EQ(a.predicted_jct_s.at(0), 30.0);
    }
  }
  // Not elastic: one job on a large cluster still gets gpus.min.
  auto one = PlanSrtf({Job(7, 10, 1.0, 4, {1, 2, 3, 4})}, ClusterView{.gpus = 4, .gpus_per_node = 4});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(GpusOf(*one).at(7), 1);
}

// Pollux-like: gpus.min to the longest-waiting jobs first, then each free
// GPU to the job whose normalised speed-up rises most per GPU (a job that
// scales well gets the spare devices; one that does not is left at its
// share).
TEST(BaselinesTest, PolluxLikeAdmitsByArrivalThenGivesSpareGpusToTheBestScaling) {
  const std::vector<JobView> jobs = {Job(1, 100, 1.0, 4, {1, 1.9, 2.7, 3.4}, 5),
                                     Job(2, 100, 1.0, 4, {1, 1.1, 1.15, 1.2}, 9)};
  auto plan = PlanPolluxLike(jobs, ClusterView{.gpus = 4, .gpus_per_node = 4});
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Fair share 2 GPUs each; value = time on g / time at the fair share.
  // Job 1's step 1 -> 2 lowers it by 0.90 per GPU, job 2's by 0.10; then
  // job 1's 2 -> 3 by 0.30 takes the last GPU.
  EXPECT_EQ(GpusOf(*plan), (std::map<uint64_t, int>{{1, 3}, {2, 1}}));
  // Two devices, three single-GPU jobs: the two that waited longest run.
  auto admit = PlanPolluxLike({Job(1, 10, 1.0, 1, {}, 1), Job(2, 10, 1.0, 1, {}, 8), Job(3, 10, 1.0, 1, {}, 4)},
                              ClusterView{.gpus = 2, .gpus_per_node = 2});
  ASSERT_TRUE(admit.ok()) << admit.status();
  EXPECT_EQ(GpusOf(*admit), (std::map<uint64_t, int>{{1, 0}, {2, 1}, {3, 1}}));
}

TEST(BaselinesTest, AJobWithNoAllowedGpuCountWaitsAndABadClusterIsAnError) {
  JobView none = Job(1, 10, 1.0);
  none.iter_time_s.assign(2, 0.0);  // no count allowed
  for (auto plan : {PlanSrtf({none}, ClusterView{.gpus = 2}), PlanPolluxLike({none}, ClusterView{.gpus = 2})}) {
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(GpusOf(*plan).at(1), 0);
  }
  auto bad = PlanSrtf({Job(1, 10, 1.0)}, ClusterView{.gpus = -1});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cluster.gpus must be >= 0, got -1"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace slicesched::ymir
