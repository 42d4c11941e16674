#include "slicesched/ymir/baselines.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <queue>
#include <tuple>
#include <vector>

namespace slicesched::ymir {
namespace {

// The GPU counts job `v` may use, ascending.
std::vector<int> AllowedGpus(const JobView& v, int cluster_gpus) {
  std::vector<int> out;
  for (int g = std::max(1, v.min_gpus); g <= std::min(v.max_gpus, cluster_gpus); ++g) {
    if (static_cast<size_t>(g) < v.iter_time_s.size() && v.iter_time_s[static_cast<size_t>(g)] > 0) out.push_back(g);
  }
  return out;
}

double IterTime(const JobView& v, int g) { return v.iter_time_s[static_cast<size_t>(g)]; }

// One assignment per job: gpus[i] > 0 runs job i alone on that many GPUs.
PlanResult ToPlan(const std::vector<JobView>& jobs, const std::vector<int>& gpus,
                  std::chrono::steady_clock::time_point t0) {
  PlanResult r;
  for (size_t i = 0; i < jobs.size(); ++i) {
    Assignment a;
    a.jobs = {jobs[i].id};
    a.gpus = gpus[i];
    if (gpus[i] > 0) {
      a.mode = Mode::kNormal;
      a.predicted_jct_s = {jobs[i].remaining_iterations * IterTime(jobs[i], gpus[i])};
      r.candidates += 1;
    }
    r.assignments.push_back(std::move(a));
  }
  r.optimal = true;  // each is exactly its rule
  r.solve_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

absl::Status CheckCluster(const ClusterView& cluster) {
  if (cluster.gpus < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cluster.gpus must be >= 0, got ", cluster.gpus));
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<PlanResult> PlanSrtf(const std::vector<JobView>& jobs, const ClusterView& cluster) {
  SLICESCHED_RETURN_IF_ERROR(CheckCluster(cluster));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<int>> allowed;
  std::vector<double> remaining(jobs.size(), 0);
  for (size_t i = 0; i < jobs.size(); ++i) {
    allowed.push_back(AllowedGpus(jobs[i], cluster.gpus));
    if (!allowed[i].empty()) remaining[i] = jobs[i].remaining_iterations * IterTime(jobs[i], allowed[i].front());
  }
  std::vector<size_t> order(jobs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::tie(remaining[a], jobs[a].id) < std::tie(remaining[b], jobs[b].id);
  });
  std::vector<int> gpus(jobs.size(), 0);
  int free = cluster.gpus;
  for (size_t i : order) {
    if (allowed[i].empty() || allowed[i].front() > free) continue;
    gpus[i] = allowed[i].front();
    free -= gpus[i];
  }
  return ToPlan(jobs, gpus, t0);
}

StatusOr<PlanResult> PlanPolluxLike(const std::vector<JobView>& jobs, const ClusterView& cluster) {
  SLICESCHED_RETURN_IF_ERROR(CheckCluster(cluster));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<int>> allowed;
  for (const JobView& v : jobs) allowed.push_back(AllowedGpus(v, cluster.gpus));
  std::vector<size_t> order(jobs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::make_tuple(-jobs[a].waited_s, jobs[a].id) < std::make_tuple(-jobs[b].waited_s, jobs[b].id);
  });
  std::vector<int> gpus(jobs.size(), 0);
  std::vector<size_t> step(jobs.size(), 0);  // index into allowed[i]
  int free = cluster.gpus;
  const double fair_g = std::max(1.0, static_cast<double>(cluster.gpus) / std::max<size_t>(1, jobs.size()));
  // Per job, its time per iteration at its fair share: the largest allowed
  // count within fair_g (else its smallest).
  std::vector<double> fair_time(jobs.size(), 0);
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (allowed[i].empty()) continue;
    int fair = allowed[i].front();
    for (int a : allowed[i]) {
      if (a <= fair_g) fair = a;
    }
    fair_time[i] = IterTime(jobs[i], fair);
  }
  // Lower is better: the fair-share speed over the speed on g GPUs.
  auto value = [&](size_t i, int g) { return IterTime(jobs[i], g) / fair_time[i]; };
  using Item = std::tuple<double, uint64_t, size_t>;  // gain per GPU, ~id (lower id first), job
  std::priority_queue<Item> heap;
  auto push = [&](size_t i) {
    if (step[i] + 1 >= allowed[i].size()) return;
    const int g = allowed[i][step[i]], g2 = allowed[i][step[i] + 1];
    const double gain = (value(i, g) - value(i, g2)) / (g2 - g);
    if (gain > 0) heap.push({gain, ~jobs[i].id, i});
  };
  for (size_t i : order) {
    if (allowed[i].empty() || allowed[i].front() > free) continue;
    gpus[i] = allowed[i].front();
    free -= gpus[i];
    push(i);
  }
  while (free > 0 && !heap.empty()) {
    const size_t i = std::get<2>(heap.top());
    heap.pop();
    const int g2 = allowed[i][step[i] + 1];
    if (g2 - gpus[i] > free) continue;
    free -= g2 - gpus[i];
    gpus[i] = g2;
    ++step[i];
    push(i);
  }
  return ToPlan(jobs, gpus, t0);
}

}  // namespace slicesched::ymir
