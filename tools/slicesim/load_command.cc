// slicesim's commands: The gRPC load generator against a running sliced: load.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "command.h"
#include "slicesched/loadgen/load.h"

namespace slicesim {
namespace {

int Load(const std::vector<std::string>& args) {
  slicesched::LoadOptions o;
  std::string socket = "/tmp/sliced-demo/sliced.sock", target;
  bool json = false;
  if (int rc = Flags("load")
                   .Text("--socket", &socket)
                   .Text("--target", &target)
                   .Num("--seconds", &o.seconds)
                   .Text("--trace", &o.trace)
                   .Seed("--seed", &o.seed)
                   .Int("--streams", &o.streams)
                   .Int("--offline-streams", &o.offline_streams)
                   .Num("--token-scale", &o.token_scale)
                   .Text("--online", &o.online_deployment)
                   .Text("--offline", &o.offline_deployment)
                   .Switch("--json", &json)
                   .Parse(args)) {
    return rc;
  }
  o.target = target.empty() ? "unix:" + socket : target;
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("load", v);
  auto r = slicesched::RunLoad(o);
  if (!r.ok()) return Failed("load", r.status());
  std::printf("%s", json ? (r->ToJson() + "\n").c_str() : r->ToText().c_str());
  return 0;
}

[[maybe_unused]] const bool kRegistered = RegisterCommands({
    {"load", &Load},
});

}  // namespace
}  // namespace slicesim
