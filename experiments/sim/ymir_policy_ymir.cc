#include "ymir_policies.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

namespace slicesched::ymir_policies_internal {

namespace {

class YmirPolicy : public YmirSimPolicy {
 public:
  explicit YmirPolicy(bool transfer) : transfer_(transfer) {}
  std::string Name() const override { return transfer_ ? "Ymir" : "Ymir-elastic"; }

  absl::StatusOr<YmirSimDecision> Decide(const YmirSimState& s) override {
    const YmirSimConfig& c = *s.config;
    const size_t n = s.units.size();
    YmirSimDecision d;
    d.gpus.assign(n, 0);
    if (n == 0) return d;
    if (!s.round) {
      int used = 0;
      bool waiting = false;
      for (const auto& u : s.units) {
        used += u.gpus;
        waiting |= u.gpus == 0;
      }
      if (used >= c.gpus || !waiting) {
        for (size_t i = 0; i < n; ++i) d.gpus[i] = s.units[i].gpus;
        return d;
      }
    }
    // Fair share: the cluster split evenly over the active JOBS; a transfer
    // unit holds the shares of its members (speed: members x the speed of
    // one share), so pairing does not cost a job its share.
    size_t active_jobs = 0;
    for (const auto& u : s.units) active_jobs += c.ymir_pair_shares ? u.jobs.size() : 1;
    const double fair_g = std::max(1.0, static_cast<double>(c.gpus) / static_cast<double>(active_jobs));
    std::vector<double> fair(n), slowdown(n), ref_time(n);
    for (size_t i = 0; i < n; ++i) {
      const auto& u = s.units[i];
      const double shares = c.ymir_pair_shares ? static_cast<double>(u.jobs.size()) : 1.0;
      ref_time[i] = 1.0 / (shares *
                           YmirSpeedup(c, std::min<double>(fair_g, u.allowed_gpus.back())));
      fair[i] = std::max(1e-9, u.total_work * ref_time[i]);
      int g = u.gpus > 0 ? u.gpus : 0;
      double rest = g > 0 ? RemainingTime(s, u, g) : RemainingTime(s, u, u.allowed_gpus.back()) + c.round_s;
      slowdown[i] = (s.now - u.submit_s + rest) / fair[i];
    }
    // The window: the units with the largest current slowdown.
    std::vector<int> order = Indices(n);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      if (slowdown[static_cast<size_t>(a)] != slowdown[static_cast<size_t>(b)]) {
        return slowdown[static_cast<size_t>(a)] > slowdown[static_cast<size_t>(b)];
      }
      return s.units[static_cast<size_t>(a)].uid < s.units[static_cast<size_t>(b)].uid;
    });
    const size_t window = std::min(n, static_cast<size_t>(std::max(1, c.ilp_window)));
    std::vector<bool> in(n, false);
    if (c.ilp_donors) {
      // Half the window: the units with the largest slowdown (they most need
      // GPUs); the other half: the running units with the smallest slowdown
      // (they can best spare GPUs), so the ILP can move GPUs between them
      // and not only hand out what completions freed.
      std::vector<int> picked;
      const size_t needy = (window + 1) / 2;
      for (size_t k = 0; k < needy; ++k) picked.push_back(order[k]);
      for (size_t k = n; k-- > needy && picked.size() < window;) {
        if (s.units[static_cast<size_t>(order[k])].gpus > 0) picked.push_back(order[k]);
      }
      for (size_t k = needy; k < n && picked.size() < window; ++k) {
        if (std::find(picked.begin(), picked.end(), order[k]) == picked.end()) picked.push_back(order[k]);
      }
      std::vector<int> reordered = picked;
      for (int i : order) {
        if (std::find(picked.begin(), picked.end(), i) == picked.end()) reordered.push_back(i);
      }
      order = std::move(reordered);
    }
    for (size_t k = 0; k < window; ++k) in[static_cast<size_t>(order[k])] = true;
    int capacity = c.gpus;
    for (size_t i = 0; i < n; ++i) {
      if (!in[i]) {
        d.gpus[i] = s.units[i].gpus;
        capacity -= s.units[i].gpus;
      }
    }
    std::vector<ymir::JobView> views;
    std::unordered_map<uint64_t, size_t> by_uid;
    for (size_t k = 0; k < window; ++k) {
      size_t i = static_cast<size_t>(order[k]);
      const auto& u = s.units[i];
      ymir::JobView v;
      v.id = u.uid;
      v.backbone = u.task.empty() ? std::string("-") : ymir::YmirBackbone(u.task);
      v.allow_sharing = u.pairable;
      v.has_progress = !u.fresh;
      v.min_gpus = u.allowed_gpus.front();
      v.max_gpus = u.allowed_gpus.back();
      v.remaining_iterations = u.remaining_work;
      v.iter_time_s.assign(static_cast<size_t>(v.max_gpus) + 1, 0.0);
      for (int g : u.allowed_gpus) v.iter_time_s[static_cast<size_t>(g)] = 1.0 / YmirSpeedup(c, g);
      // The reconfiguration cost the simulator charges (a resize, or resuming
      // a unit that ran before); a unit's first start is free.
      v.current_gpus = u.gpus;
      v.restart_s = u.ran && u.remaining_work > 0 ? c.restart_s : 0.0;
      v.reference_iter_time_s = ref_time[i];
      v.fair_share_jct_s = fair[i];
      v.waited_s = std::max(0.0, s.now - u.submit_s);
      by_uid[u.uid] = i;
      views.push_back(std::move(v));
    }
    std::vector<ymir::PairEstimate> pairs;
    if (transfer_) pairs = Pairs(s, order, window);
    ymir::PlannerOptions po;
    po.lambda = c.lambda;
    po.round_s = c.round_s;
    po.time_limit_s = c.ilp_time_limit_s;
    po.relative_gap = c.ilp_gap;
    po.horizon_s = c.ymir_horizon_s < 0 ? c.round_s : c.ymir_horizon_s;
    SLICESCHED_ASSIGN_OR_RETURN(ymir::PlanResult plan,
                                ymir::Plan(views, pairs, {std::max(0, capacity), c.gpus_per_node}, po));
    d.solve_s = plan.solve_seconds;
    for (const ymir::Assignment& a : plan.assignments) {
      if (a.mode == ymir::Mode::kWait) continue;
      size_t i0 = by_uid.at(a.jobs[0]);
      if (a.mode == ymir::Mode::kNormal) {
        d.gpus[i0] = a.gpus;
        continue;
      }
      d.pairs.push_back({static_cast<int>(i0), static_cast<int>(by_uid.at(a.jobs[1])), a.mode, a.gpus});
    }
    return d;
  }

 private:
  // Each pairable target's best partners by predicted gain (> 0).
  std::vector<ymir::PairEstimate> Pairs(const YmirSimState& s, const std::vector<int>& order, size_t window) const {
    const YmirSimConfig& c = *s.config;
    std::vector<ymir::PairEstimate> out;
    for (size_t kb = 0; kb < window; ++kb) {
      const auto& B = s.units[static_cast<size_t>(order[kb])];
      if (!B.fresh || !B.pairable) continue;
      struct Cand {
        double score;
        uint64_t uid;
        ymir::PairEstimate ab, ba;
        bool has_ba;
      };
      std::vector<Cand> cands;
      for (size_t ka = 0; ka < window; ++ka) {
        const auto& A = s.units[static_cast<size_t>(order[ka])];
        if (ka == kb || !A.pairable || ymir::YmirBackbone(A.task) != ymir::YmirBackbone(B.task)) continue;
        double t_ab = 0, sp = 0;
        bool has_t = s.gains->Plannable(A.task, B.task, ymir::Mode::kTemporal, &t_ab);
        bool has_s = A.fresh && s.gains->Plannable(A.task, B.task, ymir::Mode::kSpatial, &sp);
        double best = std::max(has_t ? t_ab : 0.0, has_s ? sp : 0.0);
        if (!(best > 0)) continue;
        Cand cd{best, A.uid, {}, {}, false};
        cd.ab = {A.uid, B.uid, has_t ? t_ab : -1.0, has_s ? sp : -1.0, c.spatial_overhead};
        // With both fresh, the reverse direction is the same unordered pair:
        // it is offered from B's side only when B is the source of a better
        // temporal transfer, so give it here too.
        double t_ba = 0;
        if (A.fresh && s.gains->Plannable(B.task, A.task, ymir::Mode::kTemporal, &t_ba)) {
          cd.ba = {B.uid, A.uid, t_ba, has_s ? sp : -1.0, c.spatial_overhead};
          cd.has_ba = true;
        }
        cands.push_back(cd);
      }
      std::stable_sort(cands.begin(), cands.end(), [](const Cand& x, const Cand& y) {
        if (x.score != y.score) return x.score > y.score;
        return x.uid < y.uid;
      });
      if (cands.size() > static_cast<size_t>(c.partners_per_job)) cands.resize(static_cast<size_t>(c.partners_per_job));
      for (const Cand& cd : cands) {
        out.push_back(cd.ab);
        if (cd.has_ba) out.push_back(cd.ba);
      }
    }
    return out;
  }

  bool transfer_;
};

}  // namespace

std::unique_ptr<YmirSimPolicy> MakeYmir(bool transfer) { return std::make_unique<YmirPolicy>(transfer); }

}  // namespace slicesched::ymir_policies_internal
