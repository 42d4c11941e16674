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

class ThemisPolicy : public YmirSimPolicy {
 public:
  std::string Name() const override { return "Themis"; }
  absl::StatusOr<YmirSimDecision> Decide(const YmirSimState& s) override {
    std::vector<double> rho(s.units.size());
    for (size_t i = 0; i < s.units.size(); ++i) {
      const auto& u = s.units[i];
      double ideal = u.total_work / YmirSpeedup(*s.config, u.trace_gpus);
      rho[i] = ((s.now - u.submit_s) + RemainingTime(s, u, u.trace_gpus)) / ideal;
    }
    // Running jobs whose lease has not ended keep their GPUs; the others
    // compete by rho, and winners get a new lease.
    std::vector<bool> leased(s.units.size(), false);
    for (size_t i = 0; i < s.units.size(); ++i) {
      auto it = lease_end_.find(s.units[i].uid);
      leased[i] = s.units[i].gpus > 0 && it != lease_end_.end() && it->second > s.now + 1e-9;
    }
    std::vector<int> order = Indices(s.units.size());
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      if (leased[static_cast<size_t>(a)] != leased[static_cast<size_t>(b)]) return static_cast<bool>(leased[static_cast<size_t>(a)]);
      if (rho[static_cast<size_t>(a)] != rho[static_cast<size_t>(b)]) {
        return rho[static_cast<size_t>(a)] > rho[static_cast<size_t>(b)];
      }
      return s.units[static_cast<size_t>(a)].uid < s.units[static_cast<size_t>(b)].uid;
    });
    YmirSimDecision d = FitInOrder(s, order);
    std::map<uint64_t, double> next;
    for (size_t i = 0; i < s.units.size(); ++i) {
      if (d.gpus[i] == 0) continue;
      const uint64_t uid = s.units[i].uid;
      next[uid] = leased[i] ? lease_end_[uid] : s.now + kLeaseS;
    }
    lease_end_ = std::move(next);
    return d;
  }

 private:
  static constexpr double kLeaseS = 600;
  std::map<uint64_t, double> lease_end_;
};

// Optimus and Pollux: 1 GPU each in FIFO order, then marginal-gain steps.

}  // namespace

std::unique_ptr<YmirSimPolicy> MakeThemis() { return std::make_unique<ThemisPolicy>(); }

}  // namespace slicesched::ymir_policies_internal
