// SliceScheduler: operator-level placement by what-if simulation (paper §3.4).
//
// Each round:
//   1. the seed is the first operator of the unscheduled frontier (online
//      before offline, then priority, then arrival); an offline operator
//      that has waited longer than `offline_aging`, or whose instance's
//      deadline is less than `offline_aging` away (a batch job's completion
//      window closing), goes first instead, so offline work is never
//      starved. An offline seed is placed just in
//      time: only once every operator it takes input from is running or
//      done (the batch then grows from it as any batch does, within v).
//      Offline work thus never holds a place in a device queue ahead of its
//      inputs, where it would pin a device long before it can run, and each
//      offline decision sees the server as it is when the work can start
//      (placing a whole 2048-token prefill ahead commits it to devices that
//      online bursts then occupy);
//   2. the batch grows from the seed along its instance's successors, in
//      topological order, while the predicted execution time stays within
//      the scheduling volume v;
//   3. candidates are the template's predefined partitions, each bound to
//      aligned device groups (device g*k .. g*k+k-1 for a k-slot partition),
//      kept when every batch operator's weights are resident there and every
//      operator that grows a KV checkpoint runs where that checkpoint lives,
//      and every operator lands inside the instance's allowed_devices (when
//      set: the job-level GPU set bounds operator placement);
//      offline batches (unless aged) only go to devices with fewer than
//      `offline_queue_limit` online operators outstanding: they fill the
//      gaps online work leaves instead of queueing behind it, which would
//      also leave them to block the online work that arrives next (an
//      operator is not preempted), and offline batches, aged or not, keep
//      off devices that serve an online conversation while another device
//      can take them; an online chunked prefill's pieces follow the
//      pipeline rule (pipeline_online_prefill);
//   4. every candidate is scored by a what-if simulation of the whole server
//      (in parallel on the thread pool), OOM candidates are dropped, and the
//      one with the minimum predicted mean completion of the batch wins (ties:
//      the earlier candidate);
//   5. the batch is issued with the transfers its placement implies.
// Issued-but-unfinished operators are bounded by B from the paper's Eq 3,
// t = (N*l + 1) / (s*g): B = t*s*g - 1 for a timeliness target t, simulator
// throughput s (ops/ms) and operator granularity g (ms).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/gmg/placement.h"
#include "slicesched/gmg/snapshot.h"
#include "slicesched/sched/policy.h"

namespace slicesched {

struct SliceSchedulerOptions {
  Duration volume = Duration::Millis(50);          // v
  Duration whatif_horizon = Duration::Seconds(120);  // safety bound on a what-if run
  double timeliness = 0.1;                         // t of Eq 3
  double sim_ops_per_ms = 17000;                   // s of Eq 3 (bench-sim on this machine)
  double op_granularity_ms = 10.575;               // g of Eq 3 (paper: Llama3-8B, 8 layers, A16)
  int64_t max_outstanding = -1;                    // B; -1 = from Eq 3
  int offline_queue_limit = 1;  // online operators outstanding on a device before offline work waits
  // Offline work (unless aged) also keeps off devices holding an online
  // conversation's KV cache: its next decode step comes back there within a
  // token's time, and an offline operator that started in the gap would hold
  // it up (operators are not preempted).
  bool offline_avoids_online_streams = true;
  // A device counts as serving a conversation (for the rule above and for
  // online_stream_device_cost) while an online KV cache there was made or
  // grown within this long: a conversation that streams grows its caches
  // every token, while a cache kept for later (Submit's retained outputs,
  // released by the client) does not hold the device.
  Duration stream_idle_after = Duration::Seconds(2);
  Duration offline_aging = Duration::Seconds(30);
  int max_rounds_per_call = 256;
  // Offline instances admitted into the GMG at once; 0 = kOfflineWindowPerDevice
  // per device. Offline decode steps must run where their KV caches are, so a
  // conversation waits while online work holds its devices; enough
  // conversations in flight keep the other devices' gaps filled.
  int offline_window = 0;
  // What a device an online instance does not use yet must save of the
  // batch's predicted completion to be chosen (0: anything). The what-if
  // scores only the batch, but the devices an instance's KV caches land on
  // stay its conversation's: each decode step waits in each of their queues.
  // 100 ms is about ten of the paper's fused operators; on the replay's
  // traces 25 ms to 1 s give the same online TBT within 2x and the same
  // offline work (docs/results.md), 0 gives 5x the TBT p99 on long outputs.
  Duration online_new_device_cost = Duration::Millis(100);
  // What a device that holds another online conversation's KV cache must
  // save of an online batch's predicted completion to be chosen: that
  // conversation's next decode step comes back there and waits behind
  // whatever the batch puts there, which the what-if cannot see (the step
  // does not exist yet). On conversation-like traces (outputs of hundreds of
  // tokens) 50 ms takes online TBT p99 from 1.8-2.4x Static-Online's to
  // 1.2x with the same SLO attainment and throughput; 100 ms and more
  // lower the SLO attainment for no gain in TBT (docs/design/simulator.md).
  Duration online_stream_device_cost = Duration::Millis(50);
  // Prompts of at least twice these many tokens are prefilled in pieces of
  // about that size (at most max_prefill_chunks; gmg/llama.h), online and
  // offline apart; 0: never. The pieces are operators like any other, placed
  // one by one: a piece may run on another device than the piece before it
  // (the cache so far moves with it), so a long online prompt's pieces
  // overlap across devices and its first token comes sooner than one device
  // computes it; an offline prompt's shorter operators fit shorter gaps and
  // hold a device from online work for less time. Smaller pieces run further
  // below the GEMM efficiency knee, and spreading more online prompts over
  // more devices' queues costs online TBT: on the replay's long-context
  // trace 512 gives SLO 99.8% and TBT p99 1.6x Static-Online's, 640 gives
  // 99.1% and 1.21x, no chunking 93% and 0.98x (docs/results.md).
  int64_t prefill_chunk_tokens = 640;
  int64_t offline_prefill_chunk_tokens = 512;
  int max_prefill_chunks = 8;
  // An online chunked prefill runs as a pipeline whose caches end on one
  // device: the first piece's groups go to distinct devices (the stages),
  // each later piece's group j follows the cache of group j (no cache moves
  // between stages), and the last piece runs every group on one device, so
  // the caches the prefill retains, which each decode step reads, are all
  // there. Placed op by op, a long prompt's pieces otherwise drift onto a
  // few devices and queue behind each other (a 7,000-token prompt took 4.8-6
  // s, its SLO 4.3 s) or leave the conversation's caches on four devices,
  // whose queues every decode step then waits in (online TBT p99 2.7x
  // Static-Online's). Where the rule leaves no candidate (fewer devices than
  // groups, missing weights), the op is placed without it.
  bool pipeline_online_prefill = true;
};

inline constexpr int kOfflineWindowPerDevice = 12;

class SliceScheduler final : public PlacementPolicy {
 public:
  explicit SliceScheduler(SliceSchedulerOptions options = {});
  std::string_view name() const override { return "SliceScheduler"; }
  absl::StatusOr<ScheduleStats> Schedule(SchedulerEnv& env, Timestamp now) override;
  // Offline requests in the GMG are kept to the offline window.
  int OfflineAdmissions(const SchedulerEnv& env, Timestamp now) override;
  int PrefillChunks(int64_t prompt_tokens, PriorityClass priority_class) const override;

  int64_t outstanding_bound() const { return bound_; }
  // Wall-clock latency of each round that ran what-if simulations, in us
  // (for reports; never used in decisions).
  const std::vector<double>& round_latency_us() const { return round_latency_us_; }
  const std::vector<int>& round_candidates() const { return round_candidates_; }
  // Forgets the per-round records gathered so far. A long-running caller (the
  // daemon) reads them after each Schedule() and clears them, so that they do
  // not grow without bound.
  void ClearRoundRecords() {
    round_latency_us_.clear();
    round_candidates_.clear();
  }

 private:
  struct Candidate {
    std::vector<NodePlacement> placements;
    std::vector<uint32_t> snapshot_nodes;  // indices of the batch in the snapshot
  };

  // Per device, 1 where another online conversation's KV cache lives (one
  // that `inst` neither reads nor made).
  std::vector<uint8_t> OtherStreams(const GlobalMappingGraph& g, const Instance& inst) const;
  // True when every predecessor of `op` is running or done.
  static bool InputsUnderway(const Instance& inst, int op);
  // The seed and its batch; empty when nothing can be scheduled.
  std::vector<int> CollectBatch(const SchedulerEnv& env, const Instance& inst, int seed_op) const;
  // `queue_limit`: only devices with fewer than offline_queue_limit online
  // operators outstanding; `avoid_streams`: none that serves an online
  // conversation (offline_avoids_online_streams); `pipeline`: the
  // chunked-prefill layout of inst's template when the pipeline rule
  // (pipeline_online_prefill) applies, else null.
  std::vector<Candidate> Candidates(const SchedulerEnv& env, const Instance& inst, const std::vector<int>& batch,
                                    bool queue_limit, bool avoid_streams, const ChunkedPrefillLayout* pipeline) const;
  // Whether `op` of a chunked prefill may run on `d` under the pipeline rule,
  // given where its instance's placed ops run and where candidate `c` puts
  // the ops of the batch before it.
  static bool PipelineAllows(const Instance& inst, const ChunkedPrefillLayout& layout, int op, DeviceId d,
                             const Candidate& c);
  // The chunked-prefill layout of a template, cached (pieces == 0: none).
  const ChunkedPrefillLayout& LayoutOf(const GraphTemplate& tpl);
  // Per candidate, online_new_device_cost for each device it adds to `inst`'s
  // and online_stream_device_cost for each device of another streaming
  // conversation (OtherStreams).
  std::vector<double> DeviceCosts(const GlobalMappingGraph& g, const Instance& inst,
                                     const std::vector<Candidate>& cands) const;

  SliceSchedulerOptions o_;
  Timestamp now_;  // of the Schedule() call in progress
  int64_t bound_;
  GmgSnapshot snap_;
  absl::flat_hash_map<uint32_t, ChunkedPrefillLayout> layouts_;  // by template id
  std::vector<double> round_latency_us_;
  std::vector<int> round_candidates_;
};

}  // namespace slicesched
