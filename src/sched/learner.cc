#include "slicesched/sched/learner.h"

#include <algorithm>

namespace slicesched {

void OnlineLearner::Apply(const Feedback& f, bool score) {
  const double measured = static_cast<double>(f.measured().nanos());
  if (f.kind == Feedback::Kind::kOp) {
    const std::string& type = gmg_->accelerators().device(f.device).type;
    const int key = ctx_->OpKey(type, f.tpl.value(), f.op);
    const double model = ops_->PredictNs(key, f.attrs);
    const bool has_model = ops_->HasModel(key);
    if (score) {
      op_err_.Add(model * calibration_->device_factor(f.device) *
                      (f.overlapped ? calibration_->overlap_factor() : 1.0),
                  measured);
    }
    ops_->Observe(key, f.attrs,
                  Duration::Nanos(static_cast<int64_t>(calibration_->NormalizeOp(f.device, measured, f.overlapped))));
    // Only samples that can tell a factor from the key's coefficients (see
    // the header) go to the calibration.
    bool informative = false;
    if (key >= 0) {
      if (static_cast<size_t>(key) >= op_seen_.size()) op_seen_.resize(static_cast<size_t>(key) + 1);
      Seen& seen = op_seen_[static_cast<size_t>(key)];
      if (seen.first_device < 0) seen.first_device = f.device.value();
      if (seen.first_device != f.device.value()) seen.devices = true;
      (f.overlapped ? seen.overlapped : seen.plain) = true;
      informative = has_model && (f.overlapped ? seen.plain : seen.devices);
    }
    if (informative) calibration_->ObserveOp(f.device, model, measured, f.overlapped);
    // The group's drift learns from every plain sample with a model (the
    // one-device rule does not apply to it: calibration.h).
    if (has_model && !f.overlapped) calibration_->ObserveSpeed(f.device, model, measured);
    if (f.handoff >= Duration::Zero()) transfers_->ObserveDeliveryGap(f.device, f.handoff);
  } else {
    const double model = transfers_->PredictLinkNs(f.device, f.dst, f.bytes.count());
    if (score) xfer_err_.Add(model * (f.overlapped ? calibration_->transfer_overlap_factor() : 1.0), measured);
    transfers_->Observe(f.device, f.dst, f.bytes,
                        Duration::Nanos(static_cast<int64_t>(calibration_->NormalizeTransfer(measured, f.overlapped))));
    const uint32_t pair = static_cast<uint32_t>(f.device.value()) * 65536u + f.dst.value();
    auto it = std::find_if(xfer_seen_.begin(), xfer_seen_.end(), [&](const auto& e) { return e.first == pair; });
    if (it == xfer_seen_.end()) it = xfer_seen_.insert(xfer_seen_.end(), {pair, Seen{}});
    (f.overlapped ? it->second.overlapped : it->second.plain) = true;
    if (it->second.plain) calibration_->ObserveTransfer(model, measured, f.overlapped);
    if (f.handoff >= Duration::Zero()) transfers_->ObserveLaunchGap(f.device, f.dst, f.handoff);
  }
}

}  // namespace slicesched
