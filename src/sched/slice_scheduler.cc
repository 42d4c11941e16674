#include "slicesched/sched/slice_scheduler.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "slicesched/comm/arbitration.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/gmg/llama.h"

namespace slicesched {
namespace {

// An offline operator whose instance must finish within `offline_aging`
// (a batch whose completion window is closing) is treated as aged: it
// goes first instead of waiting for a gap.
bool DeadlineNear(const GlobalMappingGraph& g, const FrontierKey& key, Timestamp now, Duration aging) {
  const Instance* inst = g.FindInstance(InstanceOfComputeId(key.node));
  return inst != nullptr && inst->spec.deadline != Timestamp::Never() &&
         inst->spec.deadline != Timestamp::Infinite() && inst->spec.deadline - now <= aging;
}

}  // namespace

SliceScheduler::SliceScheduler(SliceSchedulerOptions options) : o_(options) {
  bound_ = o_.max_outstanding >= 0
               ? o_.max_outstanding
               : std::max<int64_t>(1, static_cast<int64_t>(o_.timeliness * o_.sim_ops_per_ms * o_.op_granularity_ms) - 1);
}

std::vector<int> SliceScheduler::CollectBatch(const SchedulerEnv& env, const Instance& inst, int seed_op) const {
  const GraphTemplate& tpl = *inst.tpl;
  const std::string& type = env.gmg->accelerators().device(DeviceId(0)).type;
  const std::vector<int>& keys = env.sim->OpKeys(type, tpl.id().value());
  auto predicted = [&](int op) {
    return env.sim->ops().PredictNs(keys[op], inst.nodes[op].attrs);
  };
  std::vector<int> batch = {seed_op};
  std::vector<uint8_t> in(tpl.num_ops(), 0);
  in[seed_op] = 1;
  double total = predicted(seed_op);
  const double budget = static_cast<double>(o_.volume.nanos());
  for (int op : tpl.topo_order()) {
    if (in[op] || inst.nodes[op].state != NodeState::kUnscheduled) continue;
    bool ready = true, connected = false;
    for (int p : tpl.op(op).preds) {
      if (in[p]) {
        connected = true;
      } else if (inst.nodes[p].state == NodeState::kUnscheduled) {
        ready = false;
      }
    }
    if (!ready || !connected) continue;
    const double t = predicted(op);
    if (total + t > budget) break;
    total += t;
    in[op] = 1;
    batch.push_back(op);
  }
  return batch;
}

std::vector<uint8_t> SliceScheduler::OtherStreams(const GlobalMappingGraph& g, const Instance& inst) const {
  // Its own: the caches it reads, and those its finished operators made.
  std::vector<int32_t> own(g.accelerators().size(), 0);
  for (const std::vector<CheckpointId>* ids : {&inst.attached, &inst.produced}) {
    for (CheckpointId k : *ids) {
      const Checkpoint* c = g.FindCheckpoint(k);
      if (c != nullptr && c->priority_class == PriorityClass::kOnline) ++own[c->device.value()];
    }
  }
  std::vector<uint8_t> out(own.size(), 0);
  for (size_t d = 0; d < own.size(); ++d) {
    const DeviceId dev(static_cast<uint16_t>(d));
    out[d] = g.online_checkpoints(dev) > own[d] && now_ - g.online_kv_touched(dev) <= o_.stream_idle_after ? 1 : 0;
  }
  return out;
}

const ChunkedPrefillLayout& SliceScheduler::LayoutOf(const GraphTemplate& tpl) {
  auto it = layouts_.find(tpl.id().value());
  if (it == layouts_.end()) it = layouts_.emplace(tpl.id().value(), ChunkedPrefillLayoutOf(tpl)).first;
  return it->second;
}

bool SliceScheduler::PipelineAllows(const Instance& inst, const ChunkedPrefillLayout& layout, int op, DeviceId d,
                                    const Candidate& c) {
  const int k = layout.piece[static_cast<size_t>(op)];
  if (k < 0) return true;
  const int j = layout.group[static_cast<size_t>(op)];
  // Where op q runs: placed before, or earlier in this candidate's batch.
  auto where = [&](int q) {
    const OpNode& node = inst.nodes[static_cast<size_t>(q)];
    if (node.state != NodeState::kUnscheduled) return node.device;
    for (const NodePlacement& p : c.placements) {
      if (p.node == node.id) return p.device;
    }
    return DeviceId();
  };
  const int last = layout.pieces - 1;
  if (k == last) {  // the caches gather on the device of the last piece's first group
    const DeviceId first = j > 0 ? where(layout.Op(last, 0)) : DeviceId();
    return !first.valid() || first == d;
  }
  if (k > 0) {  // a stage: where group j's cache is
    const DeviceId stage = where(layout.Op(k - 1, j));
    return !stage.valid() || stage == d;
  }
  for (int other = 0; other < layout.groups; ++other) {  // the stages are distinct devices
    if (other != j && where(layout.Op(0, other)) == d) return false;
  }
  return true;
}

std::vector<SliceScheduler::Candidate> SliceScheduler::Candidates(const SchedulerEnv& env, const Instance& inst,
                                                                   const std::vector<int>& batch,
                                                                   bool queue_limit, bool avoid_streams,
                                                                   const ChunkedPrefillLayout* pipeline) const {
  const GlobalMappingGraph& g = *env.gmg;
  const GraphTemplate& tpl = *inst.tpl;
  const int n = static_cast<int>(g.accelerators().size());
  std::vector<Candidate> out;
  absl::flat_hash_set<std::vector<uint16_t>> seen;
  const std::vector<DeviceId>& allowed = inst.spec.allowed_devices;
  const std::vector<uint8_t> streams =
      avoid_streams && o_.offline_avoids_online_streams ? OtherStreams(g, inst) : std::vector<uint8_t>();
  for (const CandidatePartition& p : tpl.partitions()) {
    auto forced = ForcedSlots(g, inst, p);
    if (!forced.has_value()) continue;
    const int k = p.num_slots;
    std::vector<std::vector<DeviceId>> bindings;
    bool all_forced = true;
    for (const DeviceId& d : *forced) all_forced &= d.valid();
    if (all_forced) {
      bindings.push_back(*forced);
    } else {
      for (int group = 0; group + 1 <= n / k; ++group) {
        std::vector<DeviceId> b(k);
        bool ok = true;
        for (int s = 0; s < k; ++s) {
          b[s] = DeviceId(static_cast<uint16_t>(group * k + s));
          if ((*forced)[s].valid() && (*forced)[s] != b[s]) ok = false;
        }
        if (ok) bindings.push_back(std::move(b));
      }
    }
    for (const std::vector<DeviceId>& b : bindings) {
      Candidate c;
      std::vector<uint16_t> key;
      bool ok = true;
      for (int op : batch) {
        const DeviceId d = b[p.slot_of_op[op]];
        const OpSpec& spec = tpl.op(op);
        if (!spec.weight_key.empty() && !g.HasWeights(d, spec.weight_key)) ok = false;
        if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), d) == allowed.end()) ok = false;
        if (queue_limit && g.outstanding_compute(d, PriorityClass::kOnline) >= o_.offline_queue_limit) ok = false;
        if (!streams.empty() && streams[d.value()]) ok = false;
        if (pipeline != nullptr && !PipelineAllows(inst, *pipeline, op, d, c)) ok = false;
        c.placements.push_back({inst.nodes[op].id, d});
        key.push_back(d.value());
      }
      if (ok && seen.insert(key).second) out.push_back(std::move(c));
    }
  }
  return out;
}

bool SliceScheduler::InputsUnderway(const Instance& inst, int op) {
  for (int p : inst.tpl->op(op).preds) {
    const NodeState s = inst.nodes[p].state;
    if (s != NodeState::kRunning && s != NodeState::kDone) return false;
  }
  return true;
}

int SliceScheduler::PrefillChunks(int64_t prompt_tokens, PriorityClass priority_class) const {
  const int64_t piece = priority_class == PriorityClass::kOnline ? o_.prefill_chunk_tokens : o_.offline_prefill_chunk_tokens;
  if (piece <= 0) return 1;
  const int64_t pieces = prompt_tokens / piece;
  return pieces < 2 ? 1 : static_cast<int>(std::min<int64_t>(pieces, std::min(o_.max_prefill_chunks, kMaxPrefillChunks)));
}

int SliceScheduler::OfflineAdmissions(const SchedulerEnv& env, Timestamp now) {
  int live = 0;
  for (const auto& [id, inst] : env.gmg->instances()) {
    live += inst->spec.priority_class == PriorityClass::kOffline && inst->spec.tenant.value() >= kOfflineTenantBase;
  }
  const int window = o_.offline_window > 0
                         ? o_.offline_window
                         : kOfflineWindowPerDevice * static_cast<int>(env.gmg->accelerators().size());
  return std::max(0, window - live);
}

// An online instance's devices stay its conversation's: its decode steps run
// where its KV caches are and wait in each of those devices' queues on every
// token. The what-if sees only the batch, so each device a candidate adds to
// the instance's set (its first device is free) costs online_new_device_cost.
std::vector<double> SliceScheduler::DeviceCosts(const GlobalMappingGraph& g, const Instance& inst,
                                                   const std::vector<Candidate>& cands) const {
  std::vector<double> extra(cands.size(), 0.0);
  if (o_.online_new_device_cost <= Duration::Zero() && o_.online_stream_device_cost <= Duration::Zero()) return extra;
  const size_t n = g.accelerators().size();
  std::vector<uint8_t> used(n, 0);
  int in_use = 0;
  for (const OpNode& node : inst.nodes) {
    if (node.state == NodeState::kUnscheduled || !node.device.valid() || used[node.device.value()]) continue;
    used[node.device.value()] = 1;
    ++in_use;
  }
  const std::vector<uint8_t> streams =
      o_.online_stream_device_cost > Duration::Zero() ? OtherStreams(g, inst) : std::vector<uint8_t>(n, 0);
  for (size_t i = 0; i < cands.size(); ++i) {
    // Over the candidate's distinct devices: those the instance does not
    // use yet, and those of another streaming conversation.
    std::vector<uint8_t> seen(n, 0);
    int added = 0, streaming = 0;
    for (const NodePlacement& p : cands[i].placements) {
      const uint16_t d = p.device.value();
      if (seen[d]) continue;
      seen[d] = 1;
      added += used[d] ? 0 : 1;
      streaming += streams[d];
    }
    if (in_use == 0) added = std::max(0, added - 1);
    extra[i] = static_cast<double>(added) * static_cast<double>(o_.online_new_device_cost.nanos()) +
               static_cast<double>(streaming) * static_cast<double>(o_.online_stream_device_cost.nanos());
  }
  return extra;
}

absl::StatusOr<ScheduleStats> SliceScheduler::Schedule(SchedulerEnv& env, Timestamp now) {
  now_ = now;
  ScheduleStats stats;
  GlobalMappingGraph& g = *env.gmg;
  absl::flat_hash_set<uint64_t> blocked;  // instances with no candidate this call
  // Where the search for the next seed resumes. Every frontier key before a
  // cursor belongs to a blocked instance (issuing removes keys, and the
  // successors it adds sort after the issued key: same class, priority and
  // arrival, a later node), so a call walks the frontier once rather than
  // once per round.
  const auto& frontier = g.unscheduled_frontier();
  FrontierKey cursor = frontier.empty() ? FrontierKey{} : *frontier.begin();
  FrontierKey offline_cursor{PriorityClass::kOffline, std::numeric_limits<int32_t>::min(), Timestamp::Never(),
                             NodeId(0)};
  auto first_unblocked = [&](FrontierKey* from) -> const FrontierKey* {
    for (auto it = frontier.lower_bound(*from); it != frontier.end(); ++it) {
      if (blocked.contains(InstanceOfComputeId(it->node).value())) continue;
      *from = *it;
      return &*it;
    }
    return nullptr;
  };
  for (int round = 0; round < o_.max_rounds_per_call; ++round) {
    if (g.total_outstanding_compute() >= bound_) break;
    // Seed: an aged offline operator, else the frontier's first.
    bool aged = false;
    const FrontierKey* seed = first_unblocked(&offline_cursor);
    if (seed != nullptr && seed->cls == PriorityClass::kOffline &&
        (now - seed->arrival >= o_.offline_aging || DeadlineNear(g, *seed, now, o_.offline_aging))) {
      aged = true;
    } else {
      seed = first_unblocked(&cursor);
    }
    if (seed == nullptr) break;
    const InstanceId inst_id = InstanceOfComputeId(seed->node);
    const Instance& inst = *g.FindInstance(inst_id);
    const bool offline = inst.spec.priority_class == PriorityClass::kOffline;
    if (offline && !InputsUnderway(inst, OpIndexOfComputeId(seed->node))) {
      blocked.insert(inst_id.value());
      continue;
    }
    const std::vector<int> batch = CollectBatch(env, inst, OpIndexOfComputeId(seed->node));
    const ChunkedPrefillLayout* pipeline = nullptr;
    if (!offline && o_.pipeline_online_prefill && LayoutOf(*inst.tpl).pieces > 0) pipeline = &LayoutOf(*inst.tpl);
    // Aged offline work may queue behind online work, but still keeps off
    // the devices of streaming conversations while any other device can
    // take it: its operator there would hold up the conversation's next
    // token (on a conversation trace, a fifth of the slow tokens waited
    // behind an aged offline prefill).
    std::vector<Candidate> cands = Candidates(env, inst, batch, offline && !aged, offline, pipeline);
    if (cands.empty() && (aged || pipeline != nullptr)) cands = Candidates(env, inst, batch, false, false, nullptr);
    if (cands.empty()) {
      blocked.insert(inst_id.value());
      continue;
    }
    size_t best = 0;
    if (cands.size() > 1) {
      const auto t0 = std::chrono::steady_clock::now();
      g.SnapshotInto(now, &snap_);
      SLICESCHED_ASSIGN_OR_RETURN(Simulator sim, Simulator::Create(snap_, *env.sim));
      // Map the batch's nodes to snapshot indices (instances are in id order).
      auto inst_it = std::lower_bound(snap_.instances.begin(), snap_.instances.end(), inst_id.value(),
                                      [](const GmgSnapshot::Instance& i, uint64_t v) { return i.id < v; });
      const uint32_t base = inst_it->first_node;
      // Register estimator keys up front: the what-ifs below run in parallel
      // and must only read the context.
      for (const Candidate& c : cands) {
        for (const NodePlacement& p : c.placements) {
          (void)env.sim->OpKeys(g.accelerators().device(p.device).type, inst.tpl->id().value());
        }
      }
      const std::vector<double> extra =
          offline ? std::vector<double>(cands.size(), 0.0) : DeviceCosts(g, inst, cands);
      std::vector<double> score(cands.size(), std::numeric_limits<double>::infinity());
      std::vector<uint8_t> oom(cands.size(), 0);
      std::vector<int64_t> simulated(cands.size(), 0);
      auto evaluate = [&](size_t i) {
        thread_local SimScratch scratch;
        thread_local SimResult result;
        std::vector<Placement> pl;
        pl.reserve(cands[i].placements.size());
        for (const NodePlacement& p : cands[i].placements) {
          pl.push_back({base + static_cast<uint32_t>(OpIndexOfComputeId(p.node)), p.device.value()});
        }
        SimOptions so;
        so.horizon = o_.whatif_horizon;
        if (!sim.WhatIfInto(pl, so, &scratch, &result).ok()) return;
        simulated[i] = result.simulated_ops;
        if (result.oom) {
          oom[i] = 1;
          return;
        }
        if (result.batch_completed == static_cast<int>(pl.size())) {
          score[i] = result.batch_mean_completion_ns + extra[i];
        }
      };
      const auto whatif_start = std::chrono::steady_clock::now();
      if (env.pool != nullptr) {
        env.pool->ParallelFor(cands.size(), evaluate);
      } else {
        for (size_t i = 0; i < cands.size(); ++i) evaluate(i);
      }
      stats.whatif_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - whatif_start).count();
      for (int64_t n : simulated) stats.simulated_ops += n;
      stats.whatif_runs += static_cast<int>(cands.size());
      best = cands.size();
      for (size_t i = 0; i < cands.size(); ++i) {
        stats.rejected_oom += oom[i];
        if (!oom[i] && score[i] < std::numeric_limits<double>::infinity() &&
            (best == cands.size() || score[i] < score[best])) {
          best = i;
        }
      }
      round_latency_us_.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      round_candidates_.push_back(static_cast<int>(cands.size()));
      if (best == cands.size()) {  // every candidate would OOM (or never finish)
        blocked.insert(inst_id.value());
        continue;
      }
    }
    const int32_t prio = TransferPriority(static_cast<uint8_t>(inst.spec.priority_class), inst.spec.priority);
    SLICESCHED_ASSIGN_OR_RETURN(std::vector<NodeId> issued, IssuePlacements(g, cands[best].placements, prio, now));
    for (NodeId id : issued) env.backend->NodeIssued(id);
    ++stats.rounds;
    stats.issued_nodes += static_cast<int>(cands[best].placements.size());
  }
  return stats;
}

}  // namespace slicesched
