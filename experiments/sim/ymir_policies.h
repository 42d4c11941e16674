// What the job-level simulator's baseline policies share (one file per
// policy: ymir_policy_*.cc), and their factories, which MakeYmirSimPolicy
// names.
#pragma once

#include <memory>
#include <vector>

#include "slicesched/experiments/ymir_sim.h"

namespace slicesched::ymir_policies_internal {

// A unit's remaining time at g GPUs, under the simulator's speed-up model.
double RemainingTime(const YmirSimState& s, const YmirUnitView& u, int g);
// Greedy fit in `order`, each unit at its trace GPU count (non-elastic).
YmirSimDecision FitInOrder(const YmirSimState& s, const std::vector<int>& order);
// 0, 1, ..., n - 1.
std::vector<int> Indices(size_t n);

std::unique_ptr<YmirSimPolicy> MakeSrtf();
std::unique_ptr<YmirSimPolicy> MakeTiresias();
std::unique_ptr<YmirSimPolicy> MakeThemis();
// Optimus (pollux = false) and Pollux (true): the marginal-gain greedy.
std::unique_ptr<YmirSimPolicy> MakeMarginal(bool pollux);
// Ymir (transfer = true) and Ymir-elastic (false): the joint ILP.
std::unique_ptr<YmirSimPolicy> MakeYmir(bool transfer);

}  // namespace slicesched::ymir_policies_internal
