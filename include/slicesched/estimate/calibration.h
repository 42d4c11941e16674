// Runtime calibration: corrections the per-type estimators cannot express.
//
// The operator estimator is keyed by device *type*, but two devices of one
// type are rarely equally fast (clocks, thermals, PCIe placement), and an
// operator that runs while a transfer uses the same device slows down. This
// class learns, from the same executor feedback, a speed factor per device
// and a slowdown factor for overlapped computation and overlapped transfers,
// as exponentially weighted means of measured / predicted ratios. The
// simulator multiplies its predictions by them; the estimators are trained
// on measurements divided by them, so each model learns only its own part.
#pragma once

#include <cstddef>
#include <vector>

#include "slicesched/common/ids.h"

namespace slicesched {

class RuntimeCalibration {
 public:
  explicit RuntimeCalibration(size_t devices, double smoothing = 0.02);

  double device_factor(DeviceId d) const { return device_[d.value()]; }
  double overlap_factor() const { return overlap_; }
  double transfer_overlap_factor() const { return transfer_overlap_; }

  // `model_ns` is the estimator's prediction without any factor.
  void ObserveOp(DeviceId d, double model_ns, double measured_ns, bool overlapped);
  void ObserveTransfer(double model_ns, double measured_ns, bool overlapped);

  // The measurement with this calibration's factors taken out, for training
  // the per-type estimator.
  double NormalizeOp(DeviceId d, double measured_ns, bool overlapped) const {
    return measured_ns / (device_[d.value()] * (overlapped ? overlap_ : 1.0));
  }
  double NormalizeTransfer(double measured_ns, bool overlapped) const {
    return measured_ns / (overlapped ? transfer_overlap_ : 1.0);
  }

 private:
  double smoothing_;
  std::vector<double> device_;
  double overlap_ = 1.0;
  double transfer_overlap_ = 1.0;
};

}  // namespace slicesched
