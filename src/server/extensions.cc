#include "slicesched/server/extensions.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

namespace slicesched {
namespace {

// Each is set at most once, by its registering initialiser before main.
std::optional<RealBackendRegistration>& RealBackendSlot() {
  static auto* slot = new std::optional<RealBackendRegistration>();
  return *slot;
}

TrainingRunnerFactory& TrainingRunnerSlot() {
  static auto* slot = new TrainingRunnerFactory();
  return *slot;
}

[[noreturn]] void RegisteredTwice(const char* what) {
  std::fprintf(stderr, "sliced: %s registered twice\n", what);
  std::abort();
}

}  // namespace

bool RegisterRealBackend(RealBackendRegistration registration) {
  if (RealBackendSlot().has_value()) RegisteredTwice("the real backend");
  RealBackendSlot() = std::move(registration);
  return true;
}

const RealBackendRegistration* RegisteredRealBackend() {
  return RealBackendSlot().has_value() ? &*RealBackendSlot() : nullptr;
}

bool RegisterTrainingRunner(TrainingRunnerFactory factory) {
  if (TrainingRunnerSlot()) RegisteredTwice("the training runner");
  TrainingRunnerSlot() = std::move(factory);
  return true;
}

absl::StatusOr<std::unique_ptr<TrainingRunner>> CreateTrainingRunner(Master* master, jobs::JobManager* jobs,
                                                                     JobRunnerOptions options) {
  if (!TrainingRunnerSlot()) {
    return absl::FailedPreconditionError(
        "fine-tuning jobs need the LibTorch executors; this sliced was built without LibTorch (jobs stay "
        "queued)");
  }
  return TrainingRunnerSlot()(master, jobs, std::move(options));
}

}  // namespace slicesched
