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

namespace slicesched {
namespace ymir_policies_internal {

double RemainingTime(const YmirSimState& s, const YmirUnitView& u, int g) {
  return u.remaining_work / YmirSpeedup(*s.config, g);
}

YmirSimDecision FitInOrder(const YmirSimState& s, const std::vector<int>& order) {
  YmirSimDecision d;
  d.gpus.assign(s.units.size(), 0);
  int free = s.config->gpus;
  for (int i : order) {
    int g = s.units[static_cast<size_t>(i)].trace_gpus;
    if (g <= free) {
      d.gpus[static_cast<size_t>(i)] = g;
      free -= g;
    }
  }
  return d;
}

std::vector<int> Indices(size_t n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

}  // namespace ymir_policies_internal

using ymir_policies_internal::MakeMarginal;
using ymir_policies_internal::MakeSrtf;
using ymir_policies_internal::MakeThemis;
using ymir_policies_internal::MakeTiresias;
using ymir_policies_internal::MakeYmir;

std::vector<std::string> YmirSimPolicyNames() {
  return {"Ymir", "Ymir-elastic", "Tiresias", "Optimus", "Pollux", "Themis", "SRTF"};
}

absl::StatusOr<std::unique_ptr<YmirSimPolicy>> MakeYmirSimPolicy(const std::string& name) {
  if (name == "Ymir") return MakeYmir(true);
  if (name == "Ymir-elastic") return MakeYmir(false);
  if (name == "Tiresias") return MakeTiresias();
  if (name == "Optimus") return MakeMarginal(false);
  if (name == "Pollux") return MakeMarginal(true);
  if (name == "Themis") return MakeThemis();
  if (name == "SRTF") return MakeSrtf();
  std::string names;
  for (const auto& n : YmirSimPolicyNames()) names += (names.empty() ? "" : ", ") + n;
  return absl::InvalidArgumentError(StrCat("unknown policy '", name, "' (known: ", names, ", all)"));
}

}  // namespace slicesched
