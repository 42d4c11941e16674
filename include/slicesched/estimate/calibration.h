// Runtime calibration: corrections the per-type estimators cannot express.
//
// The operator estimator is keyed by device *type*, but two devices of one
// type are rarely equally fast (clocks, thermals, PCIe placement), and an
// operator that runs while a transfer uses the same device slows down. This
// class learns, from the same executor feedback, a speed factor per device
// and a slowdown factor for overlapped computation and overlapped transfers.
// The simulator multiplies its predictions by them; the estimators are
// trained on measurements divided by them, so each model learns only its own
// part.
//
// How a factor is learned: as the ratio of exponentially weighted means
// (weight `smoothing` per sample) of the measured times and of the model's
// predictions, so long operators, whose relative noise is small, weigh more
// than microsecond ones a preemption can inflate 1000x. The factor starts at
// 1 and moves to that ratio as samples accumulate: f = (1 - w) + w * M / P,
// where w = 1 - (1 - smoothing)^samples. This is the right statistic only
// because the estimators are unbiased in the same sense (estimators.h: a
// window's predicted total equals its measured total): the two must agree on
// what a right model is. With the estimators' former plain relative-error
// fit, which puts a model below the mean of noisy measurements, the ratio
// averaged above 1 even for a correct model; the factor grew, the estimator
// was trained on measurements divided by the larger factor, the ratio stayed
// above 1, and the product drifted upwards without bound (on the two-CPU
// fidelity rig both device factors climbed from 1.0 to 2.4 in 80
// iterations, over-predicting every operator).
//
// Device factors are relative speeds within a device type: the per-type
// estimator already holds the type's absolute speed, so the factors of the
// devices of one type are kept at a geometric mean of 1 (otherwise a factor
// and the estimator could trade the same scale back and forth, a random walk
// the predictions would follow). `device_groups[d]` names the type of device
// d; the count constructor puts every device in one group (a cluster of one
// device type). For the same reason, callers should feed only samples that
// can tell a factor from the estimator's coefficients (OnlineLearner: a
// device factor learns only from keys that ran on two devices or more, an
// overlap factor only from keys also seen without overlap).
//
// Evidence ages. A device factor learns only from operators that run on its
// device, and the what-if placement avoids a device that looks slow, so a
// factor that rose for a passing reason (the device's thread shared a core
// for a second) would never see the samples that bring it back: the device
// is locked out (docs/design/calibration.md;
// tests/sched/calibration_lockout_test.cc). So once the other devices of its
// group have taken `grace_samples` informative samples since its last one,
// the weight of its evidence halves every `half_life_samples` more of
// theirs, and its factor returns to its group's current value (the
// geometric mean of the other devices' raw factors): the placement then
// treats it as an ordinary member of its type, tries it, and its own
// samples decide again. Ageing scales the weighted sums and the weight
// together, so the first new samples outweigh the old ones.
//
// The clock is the group's evidence, not time: each of the others' samples
// is an operator the placement could have given this device, so ageing
// bounds how much work a device can be passed over for on old evidence
// whatever the load, while an idle system (no samples anywhere) and a
// device that keeps getting samples age nothing. (Ageing by wall time
// (feedback time) instead threw away real,
// persistent per-device skew in every idle second: `slicesim accuracy`
// 1.56% -> 2.23%.) A device alone in its group never ages (nothing to age
// towards); the overlap factors do not age (the placement cannot starve
// them). Deterministic: it depends on the samples only.
//
// Persistence (Save / Restore): the factors' state (per device its group,
// name where known, the weighted means, weight, prior and sample count; the two
// overlap factors likewise) as versioned YAML, so a restarted daemon does not
// start cold. Restore checks the text against this calibration's devices
// (count, groups, names) and changes nothing when any of it is wrong.
//
// Common-mode drift. Pinning leaves what all devices of a type share to the
// per-type estimator, which fits a window of up to 256 samples per key (and
// is made unbiased over it): on a machine whose speed changes as a whole (a
// host others share, clocks that throttle), a key that runs once per
// iteration follows over hundreds of iterations (on the two-CPU fidelity
// rig the host's speed moved 30% within seconds and the predictions lagged
// it by 27%; docs/design/calibration.md). So each
// group also learns a drift: the ratio of the same exponentially weighted
// means (kDefaultDriftSmoothing per sample), of measured times to the calibrated
// model (estimator x pinned device factor), from every plain (not
// overlapped) sample of any key with a model (ObserveSpeed; the one-device
// rule above does not apply: a drift moves every key of the group at once).
// The simulator multiplies by it (device_factor), but the estimators are
// *not* trained with it taken out (NormalizeOp leaves it in): they keep
// following the group's long-run speed over their windows, and the drift
// is the short-term ratio of the current speed to that, back at 1 once
// the windows have caught up. Taking it out of their training would make
// the product of the two unidentifiable again (the random walk above). The
// overlap factor is learned relative to the drifted speed. A drift is not
// saved (Save / Restore): it describes the last seconds, not the devices;
// a restored calibration starts it at 1.
//
// Only informative samples move a factor: model > 0, measured > 0 and
// measured / model <= 10 (a model that far off is a cold key, not a speed).
// Callers should not feed operators whose estimator has no model yet (its
// prediction is the default duration; OpEstimator::HasModel). Factors are
// clamped to [0.25, 4]. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "slicesched/common/ids.h"
#include "slicesched/gmg/accelerator.h"

namespace slicesched {

// When a device factor's evidence ages (see above), in informative samples
// taken by the other devices of its group since its last one. 2,000 is
// ~0.8 s of the others' feedback in the lock-out test (~2,500 samples a
// second over three CPU devices); in `slicesim accuracy` (8 A16s, ~150 a
// second) a pair idle between its requests rarely reaches it
// (docs/design/calibration.md).
struct CalibrationAgeing {
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  int64_t grace_samples = 2000;      // before ageing starts
  int64_t half_life_samples = 2000;  // of the evidence after that; kNever: never age
};

// What a factor has learned, for status reports and tests.
struct CalibrationFactorView {
  double factor = 1.0;  // as used by the simulator (a device's: pinned)
  double raw = 1.0;     // a device's before pinning its group; = factor otherwise
  double weight = 0;    // of the samples against the prior 1, 0..1
  int64_t samples = 0;  // informative samples taken
};
struct CalibrationView {
  std::vector<CalibrationFactorView> devices;  // by device id; factor: pinned, without the drift
  std::vector<CalibrationFactorView> drift;    // by device id: its group's drift
  std::vector<int> device_groups;
  CalibrationFactorView overlap, transfer_overlap;
};

class RuntimeCalibration {
 public:
  // `devices` devices of one type.
  explicit RuntimeCalibration(size_t devices, double smoothing = 0.02);
  // One group per device type of `accelerators` (DeviceSpec::type).
  explicit RuntimeCalibration(const AcceleratorSet& accelerators, double smoothing = 0.02);
  // device_groups[d]: the group (type) of device d, any ints.
  explicit RuntimeCalibration(std::vector<int> device_groups, double smoothing = 0.02);

  // What the simulator multiplies device d's predictions by: its pinned
  // (relative) factor times its group's drift.
  double device_factor(DeviceId d) const { return device_[d.value()] * drift_[group_index_[d.value()]].factor; }
  // The group's common-mode drift alone (see above).
  double drift_factor(DeviceId d) const { return drift_[group_index_[d.value()]].factor; }
  double overlap_factor() const { return overlap_.factor; }
  double transfer_overlap_factor() const { return transfer_overlap_.factor; }
  size_t num_devices() const { return groups_.size(); }
  CalibrationView View() const;

  // Versioned YAML of the learned state (see above).
  std::string Save() const;
  // Replaces the learned state with a Save() text; an error naming what does
  // not match (version, device count, a device's group or name, a value out
  // of range) leaves this calibration unchanged. Restored evidence ages like
  // new evidence, counting from the restore.
  absl::Status Restore(std::string_view text);

  void set_ageing(CalibrationAgeing ageing) { ageing_ = ageing; }
  // The drift's weight per sample; 0 turns the drift off (it stays 1).
  // The default, a memory of ~200 samples (~8 iterations of the fidelity
  // rig, a tenth of a second of a busy daemon's feedback), was the better of
  // 0.005 and 0.01 on that rig (docs/design/calibration.md); the device
  // factors' 0.02 let preemption noise through.
  static constexpr double kDefaultDriftSmoothing = 0.005;
  void set_drift_smoothing(double s) { drift_smoothing_ = s; }

  // `model_ns` is the estimator's prediction without any factor.
  void ObserveOp(DeviceId d, double model_ns, double measured_ns, bool overlapped);
  void ObserveTransfer(double model_ns, double measured_ns, bool overlapped);
  // A plain (not overlapped) sample of any key with a model, for the drift
  // of device d's group; `model_ns` as for ObserveOp.
  void ObserveSpeed(DeviceId d, double model_ns, double measured_ns);

  // The measurement with this calibration's factors taken out, for training
  // the per-type estimator (all but the drift: see above).
  double NormalizeOp(DeviceId d, double measured_ns, bool overlapped) const {
    return measured_ns / (device_[d.value()] * (overlapped ? overlap_.factor : 1.0));
  }
  double NormalizeTransfer(double measured_ns, bool overlapped) const {
    return measured_ns / (overlapped ? transfer_overlap_.factor : 1.0);
  }

 private:
  // Exponentially weighted means of measured and model times, and the
  // weight w of the samples in them (the rest is `prior`: 1, or the group's
  // value once aged).
  struct Ratio {
    double measured = 0, model = 0, weight = 0;
    double prior = 1.0;  // what the factor is with no weight
    double factor = 1.0;
    int64_t samples = 0;
    // factor from the means and weight (clamped).
    void Refresh();
    // Adds one sample; false if ignored.
    bool Step(double model_ns, double measured_ns, double smoothing);
  };
  void InitDevices();  // the per-device vectors and the group index, from groups_
  void PinGroup(int group);
  // Geometric mean of the raw factors of `device`'s group but itself, of
  // those with any weight (1 when none).
  double GroupPrior(size_t device) const;
  // One sample of device `d` taken: ages the other devices of its group.
  void AgeOthers(size_t d);

  double smoothing_;
  std::vector<int> groups_;
  std::vector<std::string> names_;  // device names where known (else empty)
  std::vector<Ratio> raw_;      // per device, before pinning
  std::vector<double> device_;  // per device, pinned
  std::vector<int> group_index_;  // per device: its group's index in drift_
  std::vector<Ratio> drift_;      // per distinct group, in order of first device
  double drift_smoothing_ = kDefaultDriftSmoothing;
  Ratio overlap_, transfer_overlap_;
  CalibrationAgeing ageing_;
  // Per device: samples its group's other devices took since its last one.
  std::vector<int64_t> others_since_;
};

}  // namespace slicesched
