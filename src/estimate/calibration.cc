#include "slicesched/estimate/calibration.h"

#include <algorithm>

namespace slicesched {

RuntimeCalibration::RuntimeCalibration(size_t devices, double smoothing)
    : smoothing_(smoothing), device_(devices, 1.0) {}

namespace {
// One EWMA step on a ratio, ignoring nonsense samples and clamping the factor
// to a plausible range so a burst of outliers cannot run away with it.
void Step(double* factor, double ratio, double smoothing) {
  if (!(ratio > 0.0) || ratio > 10.0) return;
  *factor = std::clamp(*factor + smoothing * (ratio - *factor), 0.25, 4.0);
}
}  // namespace

void RuntimeCalibration::ObserveOp(DeviceId d, double model_ns, double measured_ns, bool overlapped) {
  if (!(model_ns > 0.0) || d.value() >= device_.size()) return;
  if (overlapped) {
    Step(&overlap_, measured_ns / (model_ns * device_[d.value()]), smoothing_);
  } else {
    Step(&device_[d.value()], measured_ns / model_ns, smoothing_);
  }
}

void RuntimeCalibration::ObserveTransfer(double model_ns, double measured_ns, bool overlapped) {
  if (!overlapped || !(model_ns > 0.0)) return;
  Step(&transfer_overlap_, measured_ns / model_ns, smoothing_);
}

}  // namespace slicesched
