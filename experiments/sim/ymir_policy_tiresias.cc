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

class TiresiasPolicy : public YmirSimPolicy {
 public:
  std::string Name() const override { return "Tiresias"; }
  absl::StatusOr<YmirSimDecision> Decide(const YmirSimState& s) override {
    auto queue = [](double attained) { return attained < 3600 ? 0 : attained < 36000 ? 1 : 2; };
    std::vector<int> order = Indices(s.units.size());
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      const auto& ua = s.units[static_cast<size_t>(a)];
      const auto& ub = s.units[static_cast<size_t>(b)];
      int qa = queue(ua.attained_gpu_s), qb = queue(ub.attained_gpu_s);
      if (qa != qb) return qa < qb;
      if (ua.submit_s != ub.submit_s) return ua.submit_s < ub.submit_s;
      return ua.uid < ub.uid;
    });
    return FitInOrder(s, order);
  }
};

}  // namespace

std::unique_ptr<YmirSimPolicy> MakeTiresias() { return std::make_unique<TiresiasPolicy>(); }

}  // namespace slicesched::ymir_policies_internal
