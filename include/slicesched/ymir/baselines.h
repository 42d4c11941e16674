// The daemon's baseline planners, beside Ymir's joint ILP (planner.h): what
// `tools/ymir_real_run` compares Ymir with on real jobs. Each takes the same
// JobViews and returns a PlanResult of normal and wait assignments only (no
// transfer pairs), so the job runner applies it as it applies Ymir's plan.
// The job-level simulator's versions (experiments/sim/ymir_policy_*.cc) act
// on its own state; these act on what the daemon knows of a job.
//
//  * SRTF: shortest remaining time first, preemptive. Jobs in ascending
//    remaining time at gpus.min (R x t(min_gpus)), ties by id; each is
//    given gpus.min devices while they last, the rest wait (a running job
//    with more remaining time than a newcomer is preempted). Not elastic:
//    a job never gets more than gpus.min.
//  * Pollux-like: every job first gets gpus.min in arrival order (the
//    longest-waiting first), then the free devices go one step of a job's
//    allowed GPU counts at a time to the job whose goodput rises most per
//    device: value(g) = speed(fair share) / speed(g), speed(g) = 1 / t(g),
//    Pollux's p = -1 mean of normalised speed-ups (the simulator's
//    MakeMarginal(pollux = true) greedy). A step that no longer fits is
//    skipped.
//
// GPU counts a job may use are those with iter_time_s[g] > 0 in [min_gpus,
// max_gpus] (JobView). A job with no allowed count waits.
#pragma once

#include <vector>

#include "slicesched/common/status.h"
#include "slicesched/ymir/planner.h"

namespace slicesched::ymir {

StatusOr<PlanResult> PlanSrtf(const std::vector<JobView>& jobs, const ClusterView& cluster);
StatusOr<PlanResult> PlanPolluxLike(const std::vector<JobView>& jobs, const ClusterView& cluster);

}  // namespace slicesched::ymir
