#include "slicesched/ymir/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace slicesched::ymir {
namespace {

constexpr int kLutSize = 17;

std::vector<double> Lut(double t1, int max_gpus) {
  std::vector<double> lut(kLutSize, 0.0);
  for (int g = 1; g <= std::min(max_gpus, kLutSize - 1); g *= 2) {
    lut[static_cast<size_t>(g)] = t1 / std::pow(g, 0.85);
  }
  return lut;
}

JobView MakeJob(uint64_t id, double rem, double t1, int max_gpus, double fair_jct,
                double waited, std::string backbone = "vit", std::string domain = "d0") {
  JobView j;
  j.id = id;
  j.backbone = std::move(backbone);
  j.tenant = "t";
  j.trust_domain = std::move(domain);
  j.min_gpus = 1;
  j.max_gpus = max_gpus;
  j.remaining_iterations = rem;
  j.iter_time_s = Lut(t1, max_gpus);
  j.fair_share_jct_s = fair_jct;
  j.waited_s = waited;
  return j;
}

struct Instance {
  std::vector<JobView> jobs;
  std::vector<PairEstimate> pairs;
  ClusterView cluster;
};

Instance RandomInstance(std::mt19937_64& rng, int n, int gpus, int per_node,
                        int backbones = 2, int domains = 2, double pair_prob = 0.6) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  auto uni = [&](double lo, double hi) { return lo + (hi - lo) * u(rng); };
  Instance inst;
  inst.cluster = {gpus, per_node};
  const int max_choices[] = {1, 2, 4, 8};
  int fair_g = 1;
  while (fair_g * 2 <= std::max(1, gpus / std::max(n, 1))) fair_g *= 2;
  for (int i = 0; i < n; ++i) {
    int max_g = max_choices[rng() % 4];
    double t1 = uni(0.5, 2.0);
    double rem = uni(100, 2000);
    JobView j = MakeJob(static_cast<uint64_t>(1000 + i * 7), rem, t1, max_g,
                        rem * t1 / std::pow(std::min(fair_g, max_g), 0.85), uni(0, 1000),
                        "bb" + std::to_string(rng() % backbones),
                        "dom" + std::to_string(rng() % domains));
    j.allow_sharing = u(rng) < 0.8;
    j.has_progress = u(rng) < 0.3;
    if (u(rng) < 0.2) j.min_gpus = std::min(2, max_g);
    inst.jobs.push_back(std::move(j));
  }
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      if (a == b || u(rng) >= pair_prob) continue;
      PairEstimate p;
      p.a = inst.jobs[static_cast<size_t>(a)].id;
      p.b = inst.jobs[static_cast<size_t>(b)].id;
      p.temporal_gain_ab = uni(-0.2, 0.8);
      p.spatial_gain = uni(-0.2, 0.7);
      p.spatial_iter_time_factor = uni(1.0, 1.6);
      inst.pairs.push_back(p);
    }
  }
  return inst;
}

// Checks every structural constraint of a plan.
void CheckPlan(const Instance& inst, const PlanResult& r) {
  std::map<uint64_t, const JobView*> by_id;
  for (const JobView& j : inst.jobs) by_id[j.id] = &j;
  std::map<uint64_t, int> seen;
  int used = 0;
  std::vector<int> node_used((inst.cluster.gpus + inst.cluster.gpus_per_node - 1) /
                             inst.cluster.gpus_per_node, 0);
  for (const Assignment& a : r.assignments) {
    for (uint64_t id : a.jobs) ++seen[id];
    used += a.gpus;
    int placed = 0;
    for (const NodeSlice& s : a.placement) {
      ASSERT_GE(s.node, 0);
      ASSERT_LT(s.node, static_cast<int>(node_used.size()));
      node_used[static_cast<size_t>(s.node)] += s.gpus;
      placed += s.gpus;
    }
    EXPECT_EQ(placed, a.gpus);
    if (a.mode == Mode::kWait) {
      EXPECT_EQ(a.gpus, 0);
    }
    if (a.jobs.size() == 2) {
      const JobView& x = *by_id.at(a.jobs[0]);
      const JobView& y = *by_id.at(a.jobs[1]);
      EXPECT_TRUE(x.allow_sharing && y.allow_sharing);
      EXPECT_EQ(x.trust_domain, y.trust_domain);
      EXPECT_EQ(x.backbone, y.backbone);
      EXPECT_GE(a.tran_wt, 1.0);
      if (a.mode == Mode::kSpatial) {
        // Fresh jobs, or a pair already training jointly.
        const bool joint = x.joint_partner == y.id && y.joint_partner == x.id;
        EXPECT_TRUE(joint || !x.has_progress);
        EXPECT_TRUE(joint || !y.has_progress);
      }
    } else {
      EXPECT_TRUE(a.mode == Mode::kWait || a.mode == Mode::kNormal);
    }
    if (a.gpus > 0) {
      for (uint64_t id : a.jobs) {
        const JobView& j = *by_id.at(id);
        EXPECT_GE(a.gpus, j.min_gpus);
        EXPECT_LE(a.gpus, j.max_gpus);
      }
    }
  }
  EXPECT_LE(used, inst.cluster.gpus);
  for (size_t n = 0; n < node_used.size(); ++n) {
    EXPECT_LE(node_used[n], inst.cluster.gpus_per_node);
  }
  EXPECT_EQ(seen.size(), inst.jobs.size());
  for (const auto& [id, count] : seen) EXPECT_EQ(count, 1) << "job " << id;
}

TEST(YmirPlannerTest, IlpMatchesExhaustiveOnRandomInstances) {
  std::mt19937_64 rng(20240617);
  const int gpu_choices[] = {8, 12, 16};
  int paired = 0, instances = 0;
  double max_solve = 0;
  for (int iter = 0; iter < 150; ++iter) {
    int n = 1 + static_cast<int>(rng() % 6);
    int gpus = gpu_choices[rng() % 3];
    int per_node = (rng() % 2) ? 4 : 8;
    Instance inst = RandomInstance(rng, n, gpus, per_node);
    PlannerOptions opt;
    opt.lambda = (iter % 3 == 0) ? 5.0 : 1.0;
    auto ilp = Plan(inst.jobs, inst.pairs, inst.cluster, opt);
    auto ex = PlanExhaustive(inst.jobs, inst.pairs, inst.cluster, opt);
    ASSERT_TRUE(ilp.ok()) << ilp.status();
    ASSERT_TRUE(ex.ok()) << ex.status();
    EXPECT_TRUE(ilp->optimal);
    EXPECT_NEAR(ilp->objective, ex->objective, 1e-6 * (1 + std::fabs(ex->objective)))
        << "instance " << iter;
    // The ILP's selection, re-evaluated independently, attains the optimum.
    auto set = GenerateCandidates(inst.jobs, inst.pairs, inst.cluster, opt);
    ASSERT_TRUE(set.ok());
    EXPECT_NEAR(SelectionObjective(*set, ilp->selected, n, opt), ex->objective,
                1e-6 * (1 + std::fabs(ex->objective)));
    CheckPlan(inst, *ilp);
    CheckPlan(inst, *ex);
    for (const Assignment& a : ilp->assignments) paired += a.jobs.size() == 2;
    max_solve = std::max(max_solve, ilp->solve_seconds);
    ++instances;
  }
  std::printf("[ymir] %d instances, %d pairs chosen, max ILP solve %.4f s\n", instances,
              paired, max_solve);
  EXPECT_GT(paired, 0);  // the random instances do exercise transfer
}

// Two jobs on the same backbone with a strongly positive transfer estimate.
Instance BeneficialPair() {
  Instance inst;
  inst.cluster = {8, 8};
  inst.jobs.push_back(MakeJob(1, 1000, 1.0, 4, 500, 100));
  inst.jobs.push_back(MakeJob(2, 1000, 1.0, 4, 500, 100));
  // Only one GPU count so that the pair shares one allocation.
  PairEstimate p{1, 2, 0.8, 0.7, 1.1};
  inst.pairs.push_back(p);
  inst.cluster.gpus = 4;  // scarce: running both normally costs the fairness
  return inst;
}

int CountPairs(const PlanResult& r) {
  int n = 0;
  for (const Assignment& a : r.assignments) n += a.jobs.size() == 2;
  return n;
}

TEST(YmirPlannerTest, BeneficialPairIsChosenWhenEligible) {
  Instance inst = BeneficialPair();
  PlannerOptions opt;
  opt.lambda = 10;
  auto r = Plan(inst.jobs, inst.pairs, inst.cluster, opt);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(CountPairs(*r), 1);
  CheckPlan(inst, *r);
}

TEST(YmirPlannerTest, OptOutNeverPaired) {
  for (int who = 0; who < 2; ++who) {
    Instance inst = BeneficialPair();
    inst.jobs[static_cast<size_t>(who)].allow_sharing = false;
    PlannerOptions opt;
    opt.lambda = 10;
    auto r = Plan(inst.jobs, inst.pairs, inst.cluster, opt);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(CountPairs(*r), 0);
    auto set = GenerateCandidates(inst.jobs, inst.pairs, inst.cluster, opt);
    for (const Candidate& c : set->candidates) EXPECT_EQ(c.jobs.size(), 1u);
  }
}

TEST(YmirPlannerTest, DifferentTrustDomainsNeverPaired) {
  Instance inst = BeneficialPair();
  inst.jobs[1].trust_domain = "other";
  inst.jobs[1].tenant = inst.jobs[0].tenant;  // same tenant does not help
  PlannerOptions opt;
  opt.lambda = 10;
  auto r = Plan(inst.jobs, inst.pairs, inst.cluster, opt);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(CountPairs(*r), 0);
}

TEST(YmirPlannerTest, DifferentBackbonesNeverPaired) {
  Instance inst = BeneficialPair();
  inst.jobs[1].backbone = "roberta";
  PlannerOptions opt;
  opt.lambda = 10;
  auto r = Plan(inst.jobs, inst.pairs, inst.cluster, opt);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(CountPairs(*r), 0);
}

TEST(YmirPlannerTest, SpatialNeverForJobWithProgress) {
  // Temporal is harmful (gain < 0 => TranWt < 1, pruned); spatial is great.
  Instance inst = BeneficialPair();
  inst.pairs[0].temporal_gain_ab = -0.1;
  PlannerOptions opt;
  opt.lambda = 10;
  auto r = Plan(inst.jobs, inst.pairs, inst.cluster, opt);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(CountPairs(*r), 1);
  for (const Assignment& a : r->assignments) {
    if (a.jobs.size() == 2) {
      EXPECT_EQ(a.mode, Mode::kSpatial);
    }
  }
  for (int who = 0; who < 2; ++who) {
    Instance p = inst;
    p.jobs[static_cast<size_t>(who)].has_progress = true;
    auto r2 = Plan(p.jobs, p.pairs, p.cluster, opt);
    ASSERT_TRUE(r2.ok());
    for (const Assignment& a : r2->assignments) EXPECT_NE(a.mode, Mode::kSpatial);
    auto set = GenerateCandidates(p.jobs, p.pairs, p.cluster, opt);
    for (const Candidate& c : set->candidates) EXPECT_NE(c.mode, Mode::kSpatial);
  }
}

// A temporal target starts from its source's trained parameters, so a job
// that has trained is never offered as one; a source with progress is (it
// only has to finish first).
TEST(YmirPlannerTest, TemporalTargetNeverAJobWithProgress) {
  Instance inst = BeneficialPair();  // 1 -> 2 temporal, gain 0.8
  PlannerOptions opt;
  auto temporal_into = [&](const Instance& p, int target) {
    auto set = GenerateCandidates(p.jobs, p.pairs, p.cluster, opt);
    EXPECT_TRUE(set.ok()) << set.status();
    int n = 0;
    for (const Candidate& c : set->candidates) n += c.mode == Mode::kTemporal && c.jobs[1] == target;
    return n;
  };
  EXPECT_GT(temporal_into(inst, 1), 0);
  Instance source_ran = inst;
  source_ran.jobs[0].has_progress = true;
  EXPECT_GT(temporal_into(source_ran, 1), 0);
  Instance target_ran = inst;
  target_ran.jobs[1].has_progress = true;
  EXPECT_EQ(temporal_into(target_ran, 1), 0);
  auto r = Plan(target_ran.jobs, target_ran.pairs, target_ran.cluster, opt);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const Assignment& a : r->assignments) EXPECT_NE(a.mode, Mode::kTemporal);
}

// A pair already training jointly (both members name each other as
// joint_partner: one shared adapter at the same step) keeps its spatial
// candidate despite its progress; a one-sided or mismatched joint_partner
// does not make a job with progress spatially eligible.
TEST(YmirPlannerTest, SpatialKeptForAPairTrainingJointlyDespiteProgress) {
  Instance inst = BeneficialPair();
  inst.pairs[0].temporal_gain_ab = -0.1;
  PlannerOptions opt;
  opt.lambda = 10;
  auto spatial_candidates = [&](const Instance& p) {
    auto set = GenerateCandidates(p.jobs, p.pairs, p.cluster, opt);
    EXPECT_TRUE(set.ok());
    int n = 0;
    for (const Candidate& c : set->candidates) n += c.mode == Mode::kSpatial;
    return n;
  };
  Instance joint = inst;
  for (JobView& j : joint.jobs) j.has_progress = true;
  joint.jobs[0].joint_partner = joint.jobs[1].id;
  joint.jobs[1].joint_partner = joint.jobs[0].id;
  EXPECT_GT(spatial_candidates(joint), 0);
  auto r = Plan(joint.jobs, joint.pairs, joint.cluster, opt);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(CountPairs(*r), 1);
  for (const Assignment& a : r->assignments) {
    if (a.jobs.size() == 2) {
      EXPECT_EQ(a.mode, Mode::kSpatial);
    }
  }
  CheckPlan(joint, *r);
  Instance one_sided = joint;
  one_sided.jobs[1].joint_partner = 0;
  EXPECT_EQ(spatial_candidates(one_sided), 0);
  Instance other = joint;
  other.jobs[1].joint_partner = 99;
  EXPECT_EQ(spatial_candidates(other), 0);
}

TEST(YmirPlannerTest, TranWtComputationAndPruning) {
  // Paper example: A 100 steps, B 80 steps at 1 s/step (1 GPU).
  Instance inst;
  inst.cluster = {1, 1};
  inst.jobs.push_back(MakeJob(1, 100, 1.0, 1, 100, 0));
  inst.jobs.push_back(MakeJob(2, 80, 1.0, 1, 80, 0));
  // temporal A->B: B needs 50 of 80 steps (gain 0.375); spatial: 110 joint
  // steps of 180 at 1.3 s.
  inst.pairs.push_back({1, 2, 0.375, 1.0 - 110.0 / 180.0, 1.3});
  // B->A: negative transfer, must be pruned.
  inst.pairs.push_back({2, 1, -0.5, 1.0 - 110.0 / 180.0, 1.3});
  auto set = GenerateCandidates(inst.jobs, inst.pairs, inst.cluster, {});
  ASSERT_TRUE(set.ok());
  // SRTF: B (80) then A (180): sum 260.
  bool saw_temporal = false, saw_spatial = false;
  for (const Candidate& c : set->candidates) {
    EXPECT_GE(c.tran_wt, 1.0);
    if (c.mode == Mode::kTemporal) {
      saw_temporal = true;
      EXPECT_EQ(c.jobs[0], 0);
      EXPECT_NEAR(c.jct_s[0], 100, 1e-9);
      EXPECT_NEAR(c.jct_s[1], 150, 1e-9);
      EXPECT_NEAR(c.tran_wt, 260.0 / 250.0, 1e-9);
    }
    if (c.mode == Mode::kSpatial) {
      saw_spatial = true;
      EXPECT_NEAR(c.jct_s[0], 143, 1e-9);
      EXPECT_NEAR(c.tran_wt, 260.0 / 286.0, 1e-9);  // < 1: should not be here
    }
  }
  EXPECT_TRUE(saw_temporal);
  EXPECT_FALSE(saw_spatial);
  // Pruned: the spatial candidate and the B->A temporal candidate.
  EXPECT_EQ(set->pruned, 2);
  auto r = Plan(inst.jobs, inst.pairs, inst.cluster, {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->pruned, 2);
  EXPECT_EQ(r->candidates, 3);  // two normal + one temporal
}

// A spatial pair whose joint iterations run as one stream (the daemon's
// joint training) is offered only the smallest GPU count both jobs allow,
// priced from the one-stream times; without the flag it is offered every
// count both allow, priced from the data-parallel times t(g).
TEST(YmirPlannerTest, SingleStreamSpatialPairIsPricedAndSizedAsOneStream) {
  Instance inst;
  inst.cluster = {4, 4};
  inst.jobs.push_back(MakeJob(1, 100, 1.0, 4, 100, 0));  // t(1) = 1, t(2) = 2^-0.85, t(4) = 4^-0.85
  inst.jobs.push_back(MakeJob(2, 80, 2.0, 4, 160, 0));   // t(1) = 2
  PairEstimate p;
  p.a = 1;
  p.b = 2;
  p.temporal_gain_ab = -1;  // no temporal candidate (pruned)
  p.spatial_gain = 0.7;
  p.spatial_iter_time_factor = 1.1;  // TranWt = 360 t / (2 x 54 x 1.1 x 2 t) > 1 at every g
  inst.pairs.push_back(p);
  PlannerOptions opt;
  opt.min_tran_wt = 0;  // keep every pair candidate, to see them all
  auto spatial_of = [&](const CandidateSet& set) {
    std::map<int, const Candidate*> out;  // gpus -> candidate
    for (const Candidate& c : set.candidates) {
      if (c.mode == Mode::kSpatial) out[c.gpus] = &c;
    }
    return out;
  };
  const double iters = 0.3 * (100 + 80);
  auto data_parallel = GenerateCandidates(inst.jobs, inst.pairs, inst.cluster, opt);
  ASSERT_TRUE(data_parallel.ok()) << data_parallel.status();
  auto dp = spatial_of(*data_parallel);
  ASSERT_EQ(dp.size(), 3u);  // g = 1, 2, 4
  EXPECT_NEAR(dp.at(4)->jct_s[0], iters * 1.1 * 2.0 / std::pow(4, 0.85), 1e-9);

  inst.pairs[0].spatial_single_stream = true;
  auto one = GenerateCandidates(inst.jobs, inst.pairs, inst.cluster, opt);
  ASSERT_TRUE(one.ok()) << one.status();
  auto ss = spatial_of(*one);
  ASSERT_EQ(ss.size(), 1u);
  ASSERT_TRUE(ss.contains(1));
  EXPECT_NEAR(ss.at(1)->jct_s[0], iters * 1.1 * 2.0, 1e-9);  // the slower member's one-stream time
  EXPECT_NEAR(ss.at(1)->jct_s[1], iters * 1.1 * 2.0, 1e-9);
  // Normal candidates are unchanged.
  EXPECT_EQ(one->candidates.size() - ss.size(), data_parallel->candidates.size() - dp.size());

  // Both jobs need 2 GPUs at least: the pair is offered 2, at the t(2)
  // each job reports for its minimum (its one-stream time there).
  Instance two = inst;
  for (JobView& j : two.jobs) {
    j.min_gpus = 2;
    j.iter_time_s[1] = 0;
  }
  auto at_two = GenerateCandidates(two.jobs, two.pairs, two.cluster, opt);
  ASSERT_TRUE(at_two.ok()) << at_two.status();
  auto s2 = spatial_of(*at_two);
  ASSERT_EQ(s2.size(), 1u);
  ASSERT_TRUE(s2.contains(2));
  EXPECT_NEAR(s2.at(2)->jct_s[0], iters * 1.1 * 2.0 / std::pow(2, 0.85), 1e-9);

  // Through the ILP: with a large transfer bonus the pair is chosen, on one
  // GPU (the data-parallel pricing would give it all four).
  opt.lambda = 100;
  inst.pairs[0].spatial_single_stream = false;
  auto r_dp = Plan(inst.jobs, inst.pairs, inst.cluster, opt);
  ASSERT_TRUE(r_dp.ok()) << r_dp.status();
  inst.pairs[0].spatial_single_stream = true;
  auto r_one = Plan(inst.jobs, inst.pairs, inst.cluster, opt);
  ASSERT_TRUE(r_one.ok()) << r_one.status();
  auto spatial_gpus = [](const PlanResult& r) {
    for (const Assignment& a : r.assignments) {
      if (a.mode == Mode::kSpatial) return a.gpus;
    }
    return -1;
  };
  EXPECT_EQ(spatial_gpus(*r_dp), 4);
  EXPECT_EQ(spatial_gpus(*r_one), 1);
}

TEST(YmirPlannerTest, PackingUsesFewestNodes) {
  ClusterView c{16, 4};
  auto p = PackOntoNodes({2, 4, 2, 4, 1, 1, 2}, c);
  ASSERT_TRUE(p.ok());
  for (const auto& slices : *p) EXPECT_EQ(slices.size(), 1u);
  p = PackOntoNodes({8, 4, 4}, c);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)[0].size(), 2u);
  EXPECT_EQ((*p)[1].size(), 1u);
  EXPECT_EQ((*p)[2].size(), 1u);
  p = PackOntoNodes({16}, c);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)[0].size(), 4u);
  p = PackOntoNodes({3, 1, 3, 1, 8}, c);  // 8 takes two nodes, 3+1 share
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)[4].size(), 2u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ((*p)[i].size(), 1u);
  EXPECT_FALSE(PackOntoNodes({10, 10}, c).ok());

  // The planner packs its assignments: every running job of <= 4 GPUs whose
  // plan fits node by node sits on a single node here.
  Instance inst;
  inst.cluster = {16, 4};
  for (int i = 0; i < 4; ++i) {
    inst.jobs.push_back(MakeJob(static_cast<uint64_t>(i + 1), 1000, 1.0, 4, 500, 0,
                                "bb" + std::to_string(i)));
  }
  auto r = Plan(inst.jobs, inst.pairs, inst.cluster, {});
  ASSERT_TRUE(r.ok());
  for (const Assignment& a : r->assignments) {
    EXPECT_EQ(a.gpus, 4);
    EXPECT_EQ(a.placement.size(), 1u);
  }
}

TEST(YmirPlannerTest, InvalidInputsRejected) {
  Instance inst = BeneficialPair();
  inst.jobs[1].id = inst.jobs[0].id;
  EXPECT_FALSE(Plan(inst.jobs, inst.pairs, inst.cluster, {}).ok());
  inst = BeneficialPair();
  inst.jobs[0].fair_share_jct_s = 0;
  EXPECT_FALSE(Plan(inst.jobs, inst.pairs, inst.cluster, {}).ok());
  std::mt19937_64 rng(1);
  Instance big = RandomInstance(rng, 9, 16, 4);
  EXPECT_FALSE(PlanExhaustive(big.jobs, big.pairs, big.cluster, {}).ok());
  // No jobs: empty plan.
  auto r = Plan({}, {}, {8, 4}, {});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->assignments.empty());
}

// The horizon and reconfiguration-cost options, on random instances: the ILP
// still attains the exhaustive optimum of the same objective.
TEST(YmirPlannerTest, IlpMatchesExhaustiveWithHorizonAndRestartCost) {
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  int changed_from_default = 0;
  for (int iter = 0; iter < 120; ++iter) {
    int n = 1 + static_cast<int>(rng() % 6);
    Instance inst = RandomInstance(rng, n, 8 + 4 * static_cast<int>(rng() % 3), 4);
    for (JobView& j : inst.jobs) {
      j.reference_iter_time_s = u(rng) < 0.8 ? 0.3 + u(rng) : 0.0;
      j.current_gpus = u(rng) < 0.5 ? (u(rng) < 0.5 ? j.min_gpus : j.max_gpus) : 0;
      j.restart_s = u(rng) < 0.7 ? 50 + 200 * u(rng) : 0.0;
    }
    PlannerOptions opt;
    opt.horizon_s = iter % 4 == 0 ? 0.0 : 50 + 400 * u(rng);
    auto ilp = Plan(inst.jobs, inst.pairs, inst.cluster, opt);
    auto ex = PlanExhaustive(inst.jobs, inst.pairs, inst.cluster, opt);
    ASSERT_TRUE(ilp.ok()) << ilp.status();
    ASSERT_TRUE(ex.ok()) << ex.status();
    EXPECT_TRUE(ilp->optimal);
    EXPECT_NEAR(ilp->objective, ex->objective, 1e-6 * (1 + std::fabs(ex->objective)))
        << "instance " << iter;
    CheckPlan(inst, *ilp);
    auto plain = PlanExhaustive(inst.jobs, inst.pairs, inst.cluster, PlannerOptions{});
    ASSERT_TRUE(plain.ok());
    changed_from_default += plain->selected != ex->selected;
  }
  // The options do change decisions (the test is not vacuous).
  EXPECT_GT(changed_from_default, 10);
}

TEST(YmirPlannerTest, HorizonPredictsOneAllocationThenTheReferenceSpeed) {
  // 1000 iterations at 1 s on 1 GPU, 0.5 s on 2; reference 0.8 s.
  JobView j = MakeJob(1, 1000, 1.0, 2, 800, 0);
  j.iter_time_s = {0, 1.0, 0.5};
  j.reference_iter_time_s = 0.8;
  PlannerOptions opt;
  opt.horizon_s = 100;
  auto set = GenerateCandidates({j}, {}, {4, 4}, opt);
  ASSERT_TRUE(set.ok()) << set.status();
  std::map<int, double> jct;
  for (const Candidate& c : set->candidates) jct[c.gpus] = c.jct_s[0];
  EXPECT_NEAR(jct[1], 100 + (1000 - 100) * 0.8, 1e-9);  // 100 iters, then 900 at 0.8 s
  EXPECT_NEAR(jct[2], 100 + (1000 - 200) * 0.8, 1e-9);
  EXPECT_NEAR(jct[0], 100 + 1000 * 0.8, 1e-9);          // wait: no progress, then 0.8 s
  // A job that finishes within the horizon is not affected.
  j.remaining_iterations = 150;
  set = GenerateCandidates({j}, {}, {4, 4}, opt);
  ASSERT_TRUE(set.ok());
  for (const Candidate& c : set->candidates) {
    if (c.gpus == 2) {
      EXPECT_NEAR(c.jct_s[0], 75, 1e-9);
    }
    if (c.gpus == 1) {
      EXPECT_NEAR(c.jct_s[0], 100 + 50 * 0.8, 1e-9);
    }
  }
  // Temporal A -> B on 1 GPU: A's 60 iterations, then B's (1 - 0.5) * 100 = 50:
  // 40 of them before the horizon at 1 s, 10 after at the pair's reference,
  // both members' fair shares: 1 / (1 / 0.8 + 1 / 0.8) = 0.4 s.
  JobView a = MakeJob(1, 60, 1.0, 1, 100, 0), b = MakeJob(2, 100, 1.0, 1, 100, 0);
  a.reference_iter_time_s = b.reference_iter_time_s = 0.8;
  set = GenerateCandidates({a, b}, {{1, 2, 0.5, -1, 1}}, {1, 1}, opt);
  ASSERT_TRUE(set.ok());
  bool saw = false;
  for (const Candidate& c : set->candidates) {
    if (c.mode != Mode::kTemporal) continue;
    saw = true;
    EXPECT_NEAR(c.jct_s[0], 60, 1e-9);
    EXPECT_NEAR(c.jct_s[1], 100 + 10 * 0.4, 1e-9);
    // TranWt measures the transfer on the allocation alone: SRTF 60 + 160
    // against 60 + 110.
    EXPECT_NEAR(c.tran_wt, 220.0 / 170.0, 1e-9);
  }
  EXPECT_TRUE(saw);
  // Bad option / field values are rejected by name.
  opt.horizon_s = -1;
  EXPECT_FALSE(GenerateCandidates({j}, {}, {4, 4}, opt).ok());
  opt.horizon_s = 100;
  j.restart_s = -5;
  auto bad = GenerateCandidates({j}, {}, {4, 4}, opt);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("restart_s"), std::string::npos);
}

// Without a horizon, GPUs go to growing jobs that already run (the benefit of
// a larger allocation is counted over the job's whole remaining time, a
// waiting job only loses one round); with the horizon both are compared over
// the same round, and the waiting short job is admitted.
TEST(YmirPlannerTest, HorizonAdmitsAWaitingShortJobBeforeGrowingALongOne) {
  JobView longj = MakeJob(1, 20000, 1.0, 2, 20000, 0);
  longj.iter_time_s = {0, 1.0, 0.55};
  longj.current_gpus = 1;
  JobView shortj = MakeJob(2, 600, 1.0, 1, 600, 0);
  shortj.iter_time_s = {0, 1.0};
  for (JobView* j : {&longj, &shortj}) j->reference_iter_time_s = 1.0;
  // The long job has the largest slowdown in every plan (z is its slowdown).
  longj.waited_s = 30000;
  PlannerOptions old_model;
  auto r = Plan({longj, shortj}, {}, {2, 2}, old_model);
  ASSERT_TRUE(r.ok()) << r.status();
  auto gpus_of = [](const PlanResult& p, uint64_t id) {
    for (const Assignment& a : p.assignments) {
      if (a.jobs[0] == id) return a.gpus;
    }
    return -1;
  };
  EXPECT_EQ(gpus_of(*r, 1), 2);
  EXPECT_EQ(gpus_of(*r, 2), 0);
  PlannerOptions horizon;
  horizon.horizon_s = 120;
  r = Plan({longj, shortj}, {}, {2, 2}, horizon);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(gpus_of(*r, 1), 1);
  EXPECT_EQ(gpus_of(*r, 2), 1);
}

// The reconfiguration cost makes allocations sticky: a running job is resized
// only when the predicted gain beats the restart it costs.
TEST(YmirPlannerTest, RestartCostKeepsAllocationsUnlessResizingGainsEnough) {
  JobView j = MakeJob(1, 200, 1.0, 2, 200, 0);
  j.iter_time_s = {0, 1.0, 0.6};  // 2 GPUs save 80 s of its 200
  j.current_gpus = 1;
  auto gpus = [&](double restart_s) {
    JobView v = j;
    v.restart_s = restart_s;
    auto r = Plan({v}, {}, {2, 2}, {});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->assignments[0].gpus : -1;
  };
  EXPECT_EQ(gpus(0), 2);
  EXPECT_EQ(gpus(60), 2);   // 80 s saved > 60 s restart
  EXPECT_EQ(gpus(100), 1);  // 80 s saved < 100 s restart: stays on 1 GPU
  // A preempted job pays the restart whatever it gets, and its wait option
  // includes it as well (it restarts when it resumes).
  JobView p = j;
  p.current_gpus = 0;
  p.restart_s = 30;
  PlannerOptions opt;
  opt.horizon_s = 50;
  auto set = GenerateCandidates({p}, {}, {2, 2}, opt);
  ASSERT_TRUE(set.ok());
  for (const Candidate& c : set->candidates) {
    if (c.gpus == 1) {
      EXPECT_NEAR(c.jct_s[0], 50 + (200 - 20) * 1.0, 1e-9);
    }
    if (c.gpus == 0) {
      EXPECT_NEAR(c.jct_s[0], 50 + 30 + 200 * 1.0, 1e-9);
    }
  }
}

TEST(YmirPlannerTest, LargeInstanceSolvesQuickly) {
  std::mt19937_64 rng(7);
  double total = 0, worst = 0;
  const int kRuns = 5;
  for (int run = 0; run < kRuns; ++run) {
    // Runs 0-2: 120 jobs on 240 GPUs (60 four-GPU nodes), 4 backbones,
    // 3 trust domains, ~3% of ordered pairs with estimates (~430 estimates).
    // Runs 3-4: 2x load, 240 jobs on 240 GPUs, 2 backbones, one trust domain
    // (many eligible pairs), ~1.5% of ordered pairs with estimates.
    Instance inst = run < 3 ? RandomInstance(rng, 120, 240, 4, 4, 3, 0.03)
                            : RandomInstance(rng, 240, 240, 4, 2, 1, 0.015);
    PlannerOptions opt;
    opt.time_limit_s = 20;
    auto r = Plan(inst.jobs, inst.pairs, inst.cluster, opt);
    ASSERT_TRUE(r.ok()) << r.status();
    CheckPlan(inst, *r);
    std::printf("[ymir] large run %d: %zu estimates, %d candidates (%d pruned), "
                "%d pairs chosen, solve %.3f s, optimal=%d\n",
                run, inst.pairs.size(), r->candidates, r->pruned, CountPairs(*r),
                r->solve_seconds, r->optimal ? 1 : 0);
    total += r->solve_seconds;
    worst = std::max(worst, r->solve_seconds);
    EXPECT_LT(r->solve_seconds, 10.0);
  }
  std::printf("[ymir] large: avg %.3f s, max %.3f s\n", total / kRuns, worst);
}

}  // namespace
}  // namespace slicesched::ymir
