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
#pragma once

#include "slicesched/estimate/calibration.h"
#include "slicesched/estimate/estimators.h"
#include "slicesched/gmg/gmg.h"
#include "slicesched/sched/backend.h"
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
};

}  // namespace slicesched
