#include "ymir_policies.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

namespace slicesched::ymir_policies_internal {

namespace {

class MarginalPolicy : public YmirSimPolicy {
 public:
  explicit MarginalPolicy(bool pollux) : pollux_(pollux) {}
  std::string Name() const override { return pollux_ ? "Pollux" : "Optimus"; }
  absl::StatusOr<YmirSimDecision> Decide(const YmirSimState& s) override {
    const YmirSimConfig& c = *s.config;
    YmirSimDecision d;
    d.gpus.assign(s.units.size(), 0);
    std::vector<int> order = Indices(s.units.size());
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      const auto& ua = s.units[static_cast<size_t>(a)];
      const auto& ub = s.units[static_cast<size_t>(b)];
      if (ua.submit_s != ub.submit_s) return ua.submit_s < ub.submit_s;
      return ua.uid < ub.uid;
    });
    int free = c.gpus;
    const double fair_g = std::max(1.0, static_cast<double>(c.gpus) / std::max<size_t>(1, s.units.size()));
    std::vector<int> step(s.units.size(), 0);  // index into allowed_gpus
    // value(i, g): lower is better; the greedy maximises the drop per GPU.
    auto value = [&](size_t i, int g) {
      const auto& u = s.units[i];
      if (pollux_) {
        double fair = YmirSpeedup(c, std::min<double>(fair_g, u.allowed_gpus.back()));
        return fair / YmirSpeedup(c, g);  // 1 / normalised speedup (p = -1 mean)
      }
      return RemainingTime(s, u, g);
    };
    using Item = std::tuple<double, uint64_t, size_t>;  // gain per GPU, -uid, unit
    std::priority_queue<Item> heap;
    auto push = [&](size_t i) {
      const auto& u = s.units[i];
      size_t k = static_cast<size_t>(step[i]);
      if (k + 1 >= u.allowed_gpus.size()) return;
      int g = u.allowed_gpus[k], g2 = u.allowed_gpus[k + 1];
      double gain = (value(i, g) - value(i, g2)) / (g2 - g);
      if (gain > 0) heap.push({gain, ~u.uid, i});
    };
    for (int i : order) {
      int g = s.units[static_cast<size_t>(i)].allowed_gpus.front();
      if (g <= free) {
        d.gpus[static_cast<size_t>(i)] = g;
        free -= g;
        push(static_cast<size_t>(i));
      }
    }
    while (free > 0 && !heap.empty()) {
      auto [gain, unused, i] = heap.top();
      heap.pop();
      const auto& u = s.units[i];
      int g2 = u.allowed_gpus[static_cast<size_t>(step[i]) + 1];
      int add = g2 - d.gpus[i];
      if (add > free) continue;  // this step no longer fits; the job stays
      free -= add;
      d.gpus[i] = g2;
      ++step[i];
      push(i);
    }
    return d;
  }

 private:
  bool pollux_;
};

}  // namespace

std::unique_ptr<YmirSimPolicy> MakeMarginal(bool pollux) { return std::make_unique<MarginalPolicy>(pollux); }

}  // namespace slicesched::ymir_policies_internal
