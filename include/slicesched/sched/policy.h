// Placement policies: the scheduler's decision logic, apart from mechanism.
//
// A policy looks at the GMG's unscheduled frontier and issues work into the
// GMG (IssuePlacements / IssueByPartition), telling the backend what it
// issued. SliceScheduler and every baseline implement the same interface and
// run on the same mechanism (GMG, backend, estimators), so experiments
// compare policies, not plumbing.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "slicesched/common/thread_pool.h"
#include "slicesched/gmg/gmg.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/backend/backend.h"
#include "slicesched/sim/simulator.h"

namespace slicesched {

// Everything a policy may use. Owned by the caller (the master loop).
struct SchedulerEnv {
  GlobalMappingGraph* gmg = nullptr;
  ExecutionBackend* backend = nullptr;
  SimContext* sim = nullptr;  // templates, estimators, calibration
  ThreadPool* pool = nullptr; // for parallel what-if (may be null: serial)
};

// What one Schedule() call did.
struct ScheduleStats {
  int rounds = 0;           // batches decided
  int issued_nodes = 0;     // compute nodes issued
  int whatif_runs = 0;      // simulations run
  int64_t simulated_ops = 0;   // operators those simulations advanced
  double whatif_seconds = 0;   // wall time of the what-if evaluations
  int rejected_oom = 0;     // candidates discarded for OOM
};

class PlacementPolicy {
 public:
  virtual ~PlacementPolicy() = default;
  virtual std::string_view name() const = 0;
  // Whether this deployment serves offline requests at all.
  virtual bool accepts_offline() const { return true; }
  // How many more offline requests may enter the GMG now (admission control:
  // offline work waits outside the GMG until the policy can use it).
  virtual int OfflineAdmissions(const SchedulerEnv& env, Timestamp now) = 0;
  // Into how many pieces a `prompt_tokens`-token prefill of this class is
  // cut (a chunked prefill, gmg/llama.h); 1: one piece. The caller builds
  // the prefill accordingly.
  virtual int PrefillChunks(int64_t prompt_tokens, PriorityClass priority_class) const {
    (void)prompt_tokens;
    (void)priority_class;
    return 1;
  }
  // Issues work from the unscheduled frontier at `now`.
  virtual absl::StatusOr<ScheduleStats> Schedule(SchedulerEnv& env, Timestamp now) = 0;
};

// policy.PrefillChunks bounded to what a chunked prefill can be (gmg/llama.h):
// 1 .. min(prompt_tokens, kMaxPrefillChunks). Every caller that builds a
// prefill (the replay, the daemon) asks through this.
inline int PrefillPieces(const PlacementPolicy& policy, int64_t prompt_tokens, PriorityClass priority_class) {
  const int64_t most = std::min<int64_t>(std::max<int64_t>(prompt_tokens, 1), kMaxPrefillChunks);
  return static_cast<int>(std::clamp<int64_t>(policy.PrefillChunks(prompt_tokens, priority_class), 1, most));
}

// Tenants mark which model instance a request belongs to: online instance k
// (0..3 in the paper's setup) has tenant k; offline work has tenants from
// kOfflineTenantBase on.
constexpr uint32_t kOfflineTenantBase = 100;

}  // namespace slicesched
