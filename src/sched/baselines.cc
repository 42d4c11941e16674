#include "slicesched/sched/baselines.h"

#include <algorithm>
#include <optional>

#include "slicesched/comm/arbitration.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/gmg/placement.h"

namespace slicesched {
namespace {

std::vector<DeviceId> Range(int first, int count) {
  std::vector<DeviceId> d;
  for (int i = 0; i < count; ++i) d.push_back(DeviceId(static_cast<uint16_t>(first + i)));
  return d;
}

const CandidatePartition* FindPartition(const GraphTemplate& tpl, std::string_view name) {
  for (const CandidatePartition& p : tpl.partitions()) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

bool IsPrefill(const Instance& inst) { return inst.tpl->checkpoint_inputs().empty(); }

// A decode step goes where its KV caches are: the first partition whose
// slots the checkpoints fully determine.
absl::StatusOr<std::vector<NodeId>> PlaceByKv(GlobalMappingGraph& g, const Instance& inst, Timestamp now) {
  for (const CandidatePartition& p : inst.tpl->partitions()) {
    auto forced = ForcedSlots(g, inst, p);
    if (!forced.has_value()) continue;
    bool all = true;
    for (const DeviceId& d : *forced) all &= d.valid();
    if (!all) continue;
    return IssueByPartition(g, inst.id, p, *forced,
                            TransferPriority(static_cast<uint8_t>(inst.spec.priority_class), inst.spec.priority), now);
  }
  return absl::FailedPreconditionError(StrCat("no partition of '", inst.tpl->name(), "' fits the KV caches of ", inst.id));
}

// Instances with unscheduled roots, in frontier order, each once.
std::vector<InstanceId> FrontierInstances(const GlobalMappingGraph& g) {
  std::vector<InstanceId> waiting;
  for (const FrontierKey& k : g.unscheduled_frontier()) {
    const InstanceId id = InstanceOfComputeId(k.node);
    if (std::find(waiting.begin(), waiting.end(), id) == waiting.end()) waiting.push_back(id);
  }
  return waiting;
}

int LiveOfflineInstances(const GlobalMappingGraph& g) {
  int live = 0;
  for (const auto& [id, inst] : g.instances()) live += inst->spec.tenant.value() >= kOfflineTenantBase;
  return live;
}

// What every baseline does with online prefills and with decode steps: an
// online prefill goes to its tenant's pinned pair ("pp2"), a decode step to
// where its KV caches are.
absl::StatusOr<std::vector<NodeId>> IssuePinned(GlobalMappingGraph& g, const Instance& inst, Timestamp now) {
  if (!IsPrefill(inst)) return PlaceByKv(g, inst, now);
  const CandidatePartition* pp2 = FindPartition(*inst.tpl, "pp2");
  if (pp2 == nullptr) return absl::FailedPreconditionError(StrCat(inst.tpl->name(), " has no pp2 partition"));
  const int pair = static_cast<int>(inst.spec.tenant.value() % (g.accelerators().size() / 2));
  return IssueByPartition(g, inst.id, *pp2, Range(2 * pair, 2), TransferPriority(0, inst.spec.priority), now);
}

}  // namespace

PinnedPolicy::PinnedPolicy(std::string name, std::vector<OfflineGroup> groups, bool interference_aware)
    : name_(std::move(name)), groups_(std::move(groups)), interference_aware_(interference_aware),
      inflight_(groups_.size()) {}

PinnedPolicy PinnedPolicy::StaticOnline() { return PinnedPolicy("Static-Online", {}, false); }
PinnedPolicy PinnedPolicy::FullShare() { return PinnedPolicy("Full-Share", {{Range(0, 8), "pp8"}}, false); }
PinnedPolicy PinnedPolicy::SubsetShare() { return PinnedPolicy("Subset-Share", {{Range(4, 4), "pp4"}}, false); }
PinnedPolicy PinnedPolicy::DualShare() {
  return PinnedPolicy("Dual-Share", {{Range(0, 4), "pp4"}, {Range(4, 4), "pp4"}}, true);
}

int PinnedPolicy::InFlight(const GlobalMappingGraph& g, size_t group) {
  auto& ids = inflight_[group];
  ids.erase(std::remove_if(ids.begin(), ids.end(), [&](uint64_t id) { return g.FindInstance(InstanceId(id)) == nullptr; }),
            ids.end());
  return static_cast<int>(ids.size());
}

bool PinnedPolicy::Quiet(const GlobalMappingGraph& g, size_t group) const {
  for (DeviceId d : groups_[group].devices) {
    if (g.outstanding_compute(d) > 1) return false;
  }
  return true;
}

int PinnedPolicy::OfflineAdmissions(const SchedulerEnv& env, Timestamp now) {
  if (groups_.empty()) return 0;
  int capacity = 0;
  for (size_t k = 0; k < groups_.size(); ++k) capacity += static_cast<int>(groups_[k].devices.size());
  return std::max(0, capacity - LiveOfflineInstances(*env.gmg));
}

absl::StatusOr<ScheduleStats> PinnedPolicy::Schedule(SchedulerEnv& env, Timestamp now) {
  ScheduleStats stats;
  GlobalMappingGraph& g = *env.gmg;
  for (InstanceId id : FrontierInstances(g)) {
    const Instance* inst = g.FindInstance(id);
    if (inst == nullptr) continue;
    const uint32_t tenant = inst->spec.tenant.value();
    absl::StatusOr<std::vector<NodeId>> issued = std::vector<NodeId>{};
    if (!IsPrefill(*inst) || tenant < kOfflineTenantBase) {
      issued = IssuePinned(g, *inst, now);
    } else {
      // Offline prefill: the least-loaded group with a free pipeline stage.
      size_t best = groups_.size();
      int best_load = 0;
      for (size_t k = 0; k < groups_.size(); ++k) {
        const int load = InFlight(g, k);
        if (load >= static_cast<int>(groups_[k].devices.size())) continue;
        if (interference_aware_ && !Quiet(g, k)) continue;
        if (best == groups_.size() || load < best_load) {
          best = k;
          best_load = load;
        }
      }
      if (best == groups_.size()) continue;
      const CandidatePartition* p = FindPartition(*inst->tpl, groups_[best].partition);
      if (p == nullptr) {
        return absl::FailedPreconditionError(StrCat(inst->tpl->name(), " has no partition ", groups_[best].partition));
      }
      issued = IssueByPartition(g, id, *p, groups_[best].devices, TransferPriority(1, inst->spec.priority), now);
      if (issued.ok()) inflight_[best].push_back(id.value());
    }
    SLICESCHED_RETURN_IF_ERROR(issued.status());
    // Decode steps of an offline conversation stay in its group's count.
    if (!IsPrefill(*inst) && tenant >= kOfflineTenantBase) {
      for (size_t k = 0; k < groups_.size(); ++k) {
        const DeviceId d = g.FindNode(inst->nodes[1].id)->device;
        if (std::find(groups_[k].devices.begin(), groups_[k].devices.end(), d) != groups_[k].devices.end()) {
          inflight_[k].push_back(id.value());
          break;
        }
      }
    }
    for (NodeId n : *issued) env.backend->NodeIssued(n);
    ++stats.rounds;
    stats.issued_nodes += static_cast<int>(issued->size());
  }
  return stats;
}

int PriorityColocate::OfflineAdmissions(const SchedulerEnv& env, Timestamp now) {
  const int pairs = static_cast<int>(env.gmg->accelerators().size() / 2);
  return std::max(0, per_pair_ * pairs - LiveOfflineInstances(*env.gmg));
}

bool PriorityColocate::PairFree(const GlobalMappingGraph& g, int pair) const {
  int offline = 0;
  for (int s = 0; s < 2; ++s) {
    const DeviceId d(static_cast<uint16_t>(2 * pair + s));
    if (g.outstanding_compute(d, PriorityClass::kOnline) > 0) return false;
    offline += g.outstanding_compute(d, PriorityClass::kOffline);
  }
  return offline == 0;
}

absl::StatusOr<ScheduleStats> PriorityColocate::Schedule(SchedulerEnv& env, Timestamp now) {
  ScheduleStats stats;
  GlobalMappingGraph& g = *env.gmg;
  const int pairs = static_cast<int>(g.accelerators().size() / 2);
  for (auto it = pair_of_.begin(); it != pair_of_.end();) {
    if (g.FindInstance(InstanceId(it->first)) == nullptr) {
      pair_of_.erase(it++);
    } else {
      ++it;
    }
  }
  for (InstanceId id : FrontierInstances(g)) {
    const Instance* inst = g.FindInstance(id);
    if (inst == nullptr) continue;
    if (inst->spec.tenant.value() < kOfflineTenantBase) {  // online: as Static-Online
      absl::StatusOr<std::vector<NodeId>> issued = IssuePinned(g, *inst, now);
      SLICESCHED_RETURN_IF_ERROR(issued.status());
      for (NodeId n : *issued) env.backend->NodeIssued(n);
      ++stats.rounds;
      stats.issued_nodes += static_cast<int>(issued->size());
      continue;
    }
    // Offline: the pair its KV caches live on, or (a new prefill) the pair
    // with the fewest offline requests.
    const CandidatePartition* part = FindPartition(*inst->tpl, "pp2");
    const auto slots = part != nullptr ? ForcedSlots(g, *inst, *part) : std::nullopt;
    if (!slots.has_value()) return absl::FailedPreconditionError(StrCat(inst->tpl->name(), " has no pp2 partition"));
    int pair = -1;
    if ((*slots)[0].valid()) {
      pair = (*slots)[0].value() / 2;
    } else if (auto it = pair_of_.find(id.value()); it != pair_of_.end()) {
      pair = it->second;
    } else {
      std::vector<int> load(pairs, 0);
      for (const auto& [other, p] : pair_of_) ++load[p];
      pair = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    }
    pair_of_[id.value()] = pair;
    if (!PairFree(g, pair)) continue;
    // The instance's first unscheduled operator whose inputs are all issued.
    for (int op : inst->tpl->topo_order()) {
      if (inst->nodes[op].state != NodeState::kUnscheduled) continue;
      bool ready = true;
      for (int p : inst->tpl->op(op).preds) ready &= inst->nodes[p].state != NodeState::kUnscheduled;
      if (!ready) continue;
      const NodePlacement placement{inst->nodes[op].id, DeviceId(static_cast<uint16_t>(2 * pair + part->slot_of_op[op]))};
      const int32_t prio = TransferPriority(static_cast<uint8_t>(inst->spec.priority_class), inst->spec.priority);
      SLICESCHED_ASSIGN_OR_RETURN(std::vector<NodeId> issued, IssuePlacements(g, {&placement, 1}, prio, now));
      for (NodeId n : issued) env.backend->NodeIssued(n);
      ++stats.rounds;
      ++stats.issued_nodes;
      break;
    }
  }
  return stats;
}

}  // namespace slicesched
