// The execution backend interface: what the scheduler drives.
//
// The same scheduler code runs against the LibTorch executors, emulated
// executors (real time) and the virtual-time cluster (trace replay). The
// master issues nodes into the GMG and tells the backend; the backend starts
// them when ready (shared queue discipline, shared transfer arbitration),
// reports Start/Finish into the GMG and hands back one feedback record per
// completed operator or transfer, which the master feeds to the estimators.
#pragma once

#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "slicesched/common/ids.h"
#include "slicesched/common/units.h"

namespace slicesched {

// One measured execution, as an executor reports it.
struct Feedback {
  enum class Kind : uint8_t { kOp, kTransfer };
  Kind kind = Kind::kOp;
  NodeId node;
  InstanceId instance;
  DeviceId device;  // transfers: source
  DeviceId dst;     // transfers only
  TemplateId tpl;
  int op = -1;
  absl::InlinedVector<int64_t, 4> attrs;
  Bytes bytes;  // transfers
  Timestamp start, end;
  // A transfer was active on the device when the operator started (for a
  // transfer: one of its ends was computing).
  bool overlapped = false;
  // The master's hand-off delay before this execution, on a cross-device
  // hop; negative when there is none or the backend does not measure it.
  // A transfer: its start minus the later of its ready time (producer end)
  // and both ends being free of other transfers (the launch gap). An
  // operator whose last input to arrive came by a transfer: its start minus
  // the later of that transfer's end and its device being free (the
  // delivery gap). The learner feeds them to TransferEstimator.
  Duration handoff = Duration::Nanos(-1);
  Duration measured() const { return end - start; }
};

class ExecutionBackend {
 public:
  virtual ~ExecutionBackend() = default;
  // `node` (compute or transfer) was issued into the GMG.
  virtual void NodeIssued(NodeId node) = 0;
  // Starts whatever can start at `now`.
  virtual absl::Status Dispatch(Timestamp now) = 0;
  // Time of the next completion the backend knows of, or Timestamp::Infinite().
  virtual Timestamp NextEventTime() const = 0;
  // Completes everything finishing at or before `t`; appends feedback.
  virtual absl::Status AdvanceTo(Timestamp t, std::vector<Feedback>* feedback) = 0;
};

}  // namespace slicesched
