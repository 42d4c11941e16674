#include "slicesched/sched/learner.h"

namespace slicesched {

void OnlineLearner::Apply(const Feedback& f, bool score) {
  const double measured = static_cast<double>(f.measured().nanos());
  if (f.kind == Feedback::Kind::kOp) {
    const std::string& type = gmg_->accelerators().device(f.device).type;
    const int key = ctx_->OpKey(type, f.tpl.value(), f.op);
    const double model = ops_->PredictNs(key, f.attrs);
    if (score) {
      op_err_.Add(model * calibration_->device_factor(f.device) *
                      (f.overlapped ? calibration_->overlap_factor() : 1.0),
                  measured);
    }
    ops_->Observe(key, f.attrs,
                  Duration::Nanos(static_cast<int64_t>(calibration_->NormalizeOp(f.device, measured, f.overlapped))));
    calibration_->ObserveOp(f.device, model, measured, f.overlapped);
    if (f.handoff >= Duration::Zero()) transfers_->ObserveDeliveryGap(f.device, f.handoff);
  } else {
    const double model = transfers_->PredictLinkNs(f.device, f.dst, f.bytes.count());
    if (score) xfer_err_.Add(model * (f.overlapped ? calibration_->transfer_overlap_factor() : 1.0), measured);
    transfers_->Observe(f.device, f.dst, f.bytes,
                        Duration::Nanos(static_cast<int64_t>(calibration_->NormalizeTransfer(measured, f.overlapped))));
    calibration_->ObserveTransfer(model, measured, f.overlapped);
    if (f.handoff >= Duration::Zero()) transfers_->ObserveLaunchGap(f.device, f.dst, f.handoff);
  }
}

}  // namespace slicesched
