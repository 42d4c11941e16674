#include "slicesched/estimate/calibration.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace slicesched {

RuntimeCalibration::RuntimeCalibration(size_t devices, double smoothing)
    : RuntimeCalibration(std::vector<int>(devices, 0), smoothing) {}

RuntimeCalibration::RuntimeCalibration(const AcceleratorSet& accelerators, double smoothing)
    : smoothing_(smoothing) {
  std::vector<std::string> types;
  for (const DeviceSpec& d : accelerators.devices()) {
    auto it = std::find(types.begin(), types.end(), d.type);
    groups_.push_back(static_cast<int>(it - types.begin()));
    if (it == types.end()) types.push_back(d.type);
  }
  raw_.resize(groups_.size());
  device_.assign(groups_.size(), 1.0);
}

RuntimeCalibration::RuntimeCalibration(std::vector<int> device_groups, double smoothing)
    : smoothing_(smoothing), groups_(std::move(device_groups)) {
  raw_.resize(groups_.size());
  device_.assign(groups_.size(), 1.0);
}

bool RuntimeCalibration::Ratio::Step(double model_ns, double measured_ns, double smoothing) {
  // Nonsense samples (and a model more than 10x off: a cold key) are
  // ignored, so a burst of them cannot run away with the factor.
  const double ratio = measured_ns / model_ns;
  if (!(model_ns > 0.0) || !(ratio > 0.0) || ratio > 10.0) return false;
  measured += smoothing * (measured_ns - measured);
  model += smoothing * (model_ns - model);
  weight += smoothing * (1.0 - weight);
  factor = std::clamp((1.0 - weight) + weight * (measured / model), 0.25, 4.0);
  return true;
}

void RuntimeCalibration::PinGroup(int group) {
  // Geometric mean of the group's raw factors -> 1.
  double log_sum = 0;
  int n = 0;
  for (size_t d = 0; d < groups_.size(); ++d) {
    if (groups_[d] != group) continue;
    log_sum += std::log(raw_[d].factor);
    ++n;
  }
  if (n == 0) return;
  const double mean = std::exp(log_sum / n);
  for (size_t d = 0; d < groups_.size(); ++d) {
    if (groups_[d] == group) device_[d] = std::clamp(raw_[d].factor / mean, 0.25, 4.0);
  }
}

void RuntimeCalibration::ObserveOp(DeviceId d, double model_ns, double measured_ns, bool overlapped) {
  if (!(model_ns > 0.0) || d.value() >= device_.size()) return;
  if (overlapped) {
    overlap_.Step(model_ns * device_[d.value()], measured_ns, smoothing_);
  } else if (raw_[d.value()].Step(model_ns, measured_ns, smoothing_)) {
    PinGroup(groups_[d.value()]);
  }
}

void RuntimeCalibration::ObserveTransfer(double model_ns, double measured_ns, bool overlapped) {
  if (!overlapped || !(model_ns > 0.0)) return;
  transfer_overlap_.Step(model_ns, measured_ns, smoothing_);
}

}  // namespace slicesched
