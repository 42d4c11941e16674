#include "slicesched/ymir/stop_loss.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "slicesched/common/strings.h"

namespace slicesched::ymir {

const char* PairingModeName(PairingMode mode) {
  return mode == PairingMode::kTemporal ? "temporal" : "spatial";
}

const char* StopLossVerdictName(StopLossVerdict v) {
  switch (v) {
    case StopLossVerdict::kUndecided:
      return "undecided";
    case StopLossVerdict::kKeep:
      return "keep";
    case StopLossVerdict::kDecouple:
      return "decouple";
  }
  return "?";
}

absl::Status StopLossOptions::Validate() const {
  if (!(window_epochs > 0) || !std::isfinite(window_epochs)) {
    return absl::InvalidArgumentError(StrCat("stop-loss window_epochs must be > 0, got ", window_epochs));
  }
  if (!(min_improvement >= 0) || !std::isfinite(min_improvement)) {
    return absl::InvalidArgumentError(
        StrCat("stop-loss min_improvement must be >= 0, got ", min_improvement));
  }
  return absl::OkStatus();
}

StopLoss::StopLoss(PairingMode mode, const StopLossOptions& options)
    : mode_(mode), options_(options), state_(mode == PairingMode::kTemporal ? 1 : 2) {}

absl::StatusOr<StopLoss> StopLoss::Create(PairingMode mode, const StopLossOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  return StopLoss(mode, options);
}

absl::StatusOr<StopLossVerdict> StopLoss::Observe(int member, double epochs, double metric,
                                                  double reference) {
  if (member < 0 || member >= members()) {
    return absl::InvalidArgumentError(StrCat("stop-loss: member ", member, " of a ",
                                             PairingModeName(mode_), " pairing (", members(),
                                             " member(s))"));
  }
  if (!std::isfinite(epochs) || epochs < 0 || !std::isfinite(metric) || !std::isfinite(reference)) {
    return absl::InvalidArgumentError(StrCat("stop-loss: member ", member, ": epochs ", epochs,
                                             ", metric ", metric, ", reference ", reference,
                                             " must be finite (epochs >= 0)"));
  }
  Member& m = state_[static_cast<size_t>(member)];
  if (epochs < m.last_epochs) {
    return absl::InvalidArgumentError(StrCat("stop-loss: member ", member, ": epochs went back from ",
                                             m.last_epochs, " to ", epochs));
  }
  m.last_epochs = epochs;
  if (verdict_ != StopLossVerdict::kUndecided || m.judged || epochs < options_.window_epochs) {
    return verdict_;
  }
  m.judged = true;
  const double bar = reference - options_.min_improvement * std::abs(reference);
  m.improved = metric < bar;
  if (!m.improved) {
    verdict_ = StopLossVerdict::kDecouple;
    reason_ = absl::StrFormat("member %d at %.2f epochs: %.4g >= reference %.4g", member, epochs,
                              metric, bar);
    return verdict_;
  }
  bool all = true;
  for (const Member& s : state_) all = all && s.judged && s.improved;
  if (all) {
    verdict_ = StopLossVerdict::kKeep;
    reason_ = absl::StrFormat("every member improved on its reference within %.2f epochs",
                              options_.window_epochs);
  }
  return verdict_;
}

}  // namespace slicesched::ymir
