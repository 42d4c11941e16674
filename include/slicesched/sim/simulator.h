// The global what-if simulator.
//
// Construction (paper §3.3, Fig 6 left) rebuilds, from a GMG snapshot alone,
// each device's queue of issued, unfinished operators; the operator running
// on it and its remaining time (start + estimate - now, never below zero);
// transfers pending and in flight; and the bytes resident on each device.
// Durations come from the estimators, evaluated once per node here.
//
// Advancement (Fig 6 right) runs one timeline, earliest completion first. A
// completion frees its device (or transfer slots), makes its outputs local
// (waking consumers on that device and transfers out of it), releases inputs
// whose last consumer it was, and cascades: each idle device starts the
// ready operator that the shared queue discipline (queue_discipline.h)
// picks, and pending transfers are granted by the shared arbitration rule
// (comm/arbitration.h). Readiness is the GMG's: every input tensor present
// on the operator's device. Each device has one compute slot and one
// transfer slot (a transfer occupies the transfer slots of both ends).
//
// Memory per device follows the GMG's accounting: outputs and workspace are
// allocated when an operator starts, workspace is released when it finishes,
// an output is released when its last consumer finishes (on every device
// holding a copy), retained outputs stay, and a transfer allocates its buffer
// at the destination when it starts. Each device's peak is kept, and OOM is
// reported at the first instant a device exceeds its capacity.
//
// What-if: WhatIf() applies a candidate placement of unscheduled operators to
// a copy of the state, inserting the transfers it implies, and runs it until
// the batch completes or the horizon passes. The live GMG is never touched.
//
// Determinism and tie-breaks: events are ordered by (time, sequence number),
// sequence numbers being assigned as events are scheduled, so equal-time
// completions are processed in the order they were started. After each
// completion the affected devices dispatch at once, so an operator that
// becomes ready at t on an idle device starts at t. Initial dispatch visits
// devices in index order. The transfers one completion makes ready are
// arbitrated together once all of its wake-ups are done (before its own
// device picks its next operator), so the rule, not the order in which they
// were woken, decides which of them goes first. The same snapshot always
// gives the same result.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "slicesched/estimate/calibration.h"
#include "slicesched/estimate/estimators.h"
#include "slicesched/gmg/graph_template.h"
#include "slicesched/gmg/snapshot.h"

namespace slicesched {

// Long-lived context for building simulators: the template registry, the
// estimators and a cache of estimator keys per (device type, template, op),
// so that building a simulator does no hashing per node. Not thread-safe for
// concurrent Create calls; a built Simulator is immutable and its Run /
// WhatIf may be called from many threads at once.
class SimContext {
 public:
  SimContext(const TemplateRegistry* templates, OpEstimator* ops, const TransferEstimator* transfers);

  const TemplateRegistry& templates() const { return *templates_; }
  const OpEstimator& ops() const { return *ops_; }
  const TransferEstimator& transfers() const { return *transfers_; }
  // Optional runtime calibration (per-device speed, overlap slowdowns).
  void set_calibration(const RuntimeCalibration* c) { calibration_ = c; }
  const RuntimeCalibration* calibration() const { return calibration_; }
  // Estimator key of (device type, template, op), registered on first use.
  int OpKey(const std::string& device_type, uint32_t template_id, int op);
  // Keys of every op of a template on a device type (empty if unknown).
  const std::vector<int>& OpKeys(const std::string& device_type, uint32_t template_id);

 private:
  const TemplateRegistry* templates_;
  OpEstimator* ops_;
  const TransferEstimator* transfers_;
  const RuntimeCalibration* calibration_ = nullptr;
  std::vector<std::string> types_;
  // keys_[type][template] = per-op keys (-1 = not yet registered)
  std::vector<std::vector<std::vector<int>>> keys_;
};

struct SimOptions {
  // Stop once simulated time passes snapshot time + horizon.
  Duration horizon = Duration::Infinite();
  // WhatIf only: stop as soon as every batch operator has completed.
  bool stop_when_batch_done = true;
};

// A candidate placement of one unscheduled compute node (snapshot index).
struct Placement {
  uint32_t node = 0;
  uint16_t device = 0;
};

struct SimResult {
  int64_t start_ns = 0;  // snapshot time
  int64_t end_ns = 0;    // time of the last processed event
  // Per node (snapshot nodes, then transfers a what-if inserted): predicted
  // start and end, -1 when not reached.
  std::vector<int64_t> node_start_ns;
  std::vector<int64_t> node_end_ns;
  // Per snapshot instance: predicted completion of its last compute node,
  // -1 if it did not complete (unplaced nodes, horizon).
  std::vector<int64_t> instance_end_ns;
  std::vector<int64_t> peak_bytes;   // per device, including the snapshot's
  std::vector<int64_t> final_bytes;  // per device when the run stopped
  bool oom = false;
  int oom_device = -1;
  int64_t oom_at_ns = -1;
  int64_t simulated_ops = 0;  // operators and transfers completed
  // WhatIf: mean predicted completion of the batch's operators, measured
  // from the snapshot time, over those that completed; and how many did.
  double batch_mean_completion_ns = 0;
  int batch_completed = 0;
  int inserted_transfers = 0;
};

// A buffer the built state holds at the snapshot instant (the
// reconstruction's view of device memory; see Simulator::ResidentBuffers).
struct SimResidentBuffer {
  uint64_t id = 0;      // producer NodeId, or CheckpointId when output < 0
  int32_t output = -1;  // output index of the producer; -1 for a checkpoint
  uint16_t device = 0;
  auto operator<=>(const SimResidentBuffer&) const = default;
};

// Buffers a run works in. Reusing one across runs (one per thread) makes a
// warm run allocation-free; the plain Run/WhatIf make a fresh one.
class SimScratch {
 public:
  SimScratch();
  ~SimScratch();
  SimScratch(SimScratch&&) noexcept;
  SimScratch& operator=(SimScratch&&) noexcept;
  struct Impl;

 private:
  friend class Simulator;
  std::unique_ptr<Impl> impl_;
};

class Simulator {
 public:
  // Builds the simulator's state from `snapshot`, which must outlive it.
  // Fails when the snapshot references a template the registry lacks.
  static absl::StatusOr<Simulator> Create(const GmgSnapshot& snapshot, SimContext& context);

  // Rebuilds this simulator from a new snapshot, reusing its buffers (no
  // allocation once warm): the scheduler keeps one and rebuilds each round.
  absl::Status Rebuild(const GmgSnapshot& snapshot, SimContext& context);

  Simulator(Simulator&&) noexcept;
  Simulator& operator=(Simulator&&) noexcept;
  ~Simulator();

  // Runs the current state forward on a copy (the simulator is reusable).
  SimResult Run(const SimOptions& options = {}) const;

  // Applies `batch` (in dependency order: each producer is scheduled in the
  // snapshot or placed earlier in the batch) on a copy and runs it. Errors
  // name the offending node: not an unscheduled compute node, a device out
  // of range, an unplaced producer.
  absl::StatusOr<SimResult> WhatIf(std::span<const Placement> batch, const SimOptions& options = {}) const;

  // The same, reusing `scratch` and the vectors of `result`.
  void RunInto(const SimOptions& options, SimScratch* scratch, SimResult* result) const;
  absl::Status WhatIfInto(std::span<const Placement> batch, const SimOptions& options, SimScratch* scratch,
                          SimResult* result) const;

  // A single run that consumes the built state instead of copying it: the
  // initial state is swapped into `scratch` and `result` (the same result as
  // RunInto). Afterwards the simulator must be rebuilt (Rebuild) before any
  // further Run, RunInto, WhatIf, WhatIfInto, RunOnceInto or duration_ns;
  // num_nodes and num_devices stay valid. For callers that run each built
  // state once (one Rebuild, one run); Run/WhatIf keep copying and may be
  // repeated. Not safe concurrently with any other call on this simulator.
  // After the run, the buffers it worked in go back to the simulator (except
  // the per-device memory vectors, which became result's peak_bytes and
  // final_bytes), so the next Rebuild overwrites memory the run has just
  // left in the cache; `scratch` keeps capacity but no meaningful state.
  void RunOnceInto(const SimOptions& options, SimScratch* scratch, SimResult* result);

  size_t num_nodes() const;
  size_t num_devices() const;

  // What the built state starts from, as reconstructed from the snapshot
  // (for checking the reconstruction against the executors). Not valid
  // after RunOnceInto until the next Rebuild.
  // The snapshot index of the compute node running on `device`, or
  // GmgSnapshot::kNone when it is idle.
  uint32_t running(size_t device) const;
  // Every complete buffer resident at the snapshot instant, sorted: each
  // copy of an operator output whose producer is done and that is not freed
  // (one entry per device holding a copy), and each retained checkpoint on
  // its device (its growth by later steps included). Not listed: outputs of
  // running operators, buffers of transfers in flight, workspace and
  // weights.
  std::vector<SimResidentBuffer> ResidentBuffers() const;
  // Predicted duration of a placed node in ns (tests and reports).
  int64_t duration_ns(uint32_t node) const;

  struct Model;  // defined in src/sim/simulator_model.h

 private:
  Simulator();
  std::unique_ptr<Model> model_;
};

}  // namespace slicesched
