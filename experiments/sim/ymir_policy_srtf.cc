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

class SrtfPolicy : public YmirSimPolicy {
 public:
  std::string Name() const override { return "SRTF"; }
  absl::StatusOr<YmirSimDecision> Decide(const YmirSimState& s) override {
    std::vector<int> order = Indices(s.units.size());
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      const auto& ua = s.units[static_cast<size_t>(a)];
      const auto& ub = s.units[static_cast<size_t>(b)];
      double ta = RemainingTime(s, ua, ua.trace_gpus), tb = RemainingTime(s, ub, ub.trace_gpus);
      if (ta != tb) return ta < tb;
      return ua.uid < ub.uid;
    });
    return FitInOrder(s, order);
  }
};

}  // namespace

std::unique_ptr<YmirSimPolicy> MakeSrtf() { return std::make_unique<SrtfPolicy>(); }

}  // namespace slicesched::ymir_policies_internal
