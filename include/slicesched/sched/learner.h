// Feeding executor feedback to the estimators and the runtime calibration.
//
// One place for what the master does with every completion record: the
// calibration learns per-device speed and overlap slowdowns from the ratio of
// measurement to model; the per-type estimators learn from the measurement
// with those factors taken out; the master's hand-off gaps of cross-device
// hops (Feedback::handoff) go to the transfer estimator, which adds them to
// what a hop costs. Errors of the predictions made before each observation
// are kept (online MAPE) for reports; a transfer's error compares its link
// time only (its measurement has no hand-off in it).
//
// The calibration learns only from samples that can tell its factors from
// the estimators' coefficients: a device factor from keys that have run on
// two devices or more (a key that only ever ran on one device absorbs that
// device's speed into its own coefficients, and the two would trade the
// same scale back and forth), an overlap factor from keys (transfer pairs)
// also seen without overlap, and nothing from keys still predicting the
// default duration (OpEstimator::HasModel). The calibration's common-mode
// drift learns from every plain sample of a key with a model.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "slicesched/estimate/calibration.h"
#include "slicesched/estimate/estimators.h"
#include "slicesched/gmg/gmg.h"
#include "slicesched/backend/backend.h"
#include "slicesched/sim/simulator.h"

namespace slicesched {

class OnlineLearner {
 public:
  // `context` must use `ops`, `transfers` and `calibration`.
  OnlineLearner(const GlobalMappingGraph* gmg, SimContext* context, OpEstimator* ops, TransferEstimator* transfers,
                RuntimeCalibration* calibration)
      : gmg_(gmg), ctx_(context), ops_(ops), transfers_(transfers), calibration_(calibration) {}

  // Applies one record; when `score`, its prediction error is counted.
  void Apply(const Feedback& f, bool score);

  const MapeCounter& op_error() const { return op_err_; }
  const MapeCounter& transfer_error() const { return xfer_err_; }

 private:
  const GlobalMappingGraph* gmg_;
  SimContext* ctx_;
  OpEstimator* ops_;
  TransferEstimator* transfers_;
  RuntimeCalibration* calibration_;
  MapeCounter op_err_, xfer_err_;
  // What each operator key (by estimator handle) and transfer pair (by
  // src * 65536 + dst) has been seen as, for the calibration's rule above.
  struct Seen {
    int first_device = -1;
    bool devices = false;        // ran on a second device
    bool plain = false, overlapped = false;
  };
  std::vector<Seen> op_seen_;
  std::vector<std::pair<uint32_t, Seen>> xfer_seen_;  // few pairs: linear scan
};

}  // namespace slicesched
