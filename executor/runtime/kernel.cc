#include "slicesched/executor/runtime/kernel.h"

#include <cstring>
#include <stdexcept>
#include <utility>

#include "absl/time/clock.h"
#include "slicesched/common/strings.h"

namespace slicesched::executor {

void RealSleeper::SleepFor(Duration d) {
  if (d > Duration::Zero()) absl::SleepFor(d.ToAbsl());
}

void SpinSleeper::SleepFor(Duration d) {
  const Timestamp until = clock_->Now() + d;
  while (clock_->Now() < until) {
  }
}

void ManualClockSleeper::SleepFor(Duration d) {
  if (d > Duration::Zero()) clock_->Advance(d);
}

void FaultInjectingRunner::FailWhen(Match match, absl::Status status) {
  absl::MutexLock l(&mu_);
  faults_.push_back(Fault{std::move(match), std::move(status), false, ""});
}

void FaultInjectingRunner::ThrowWhen(Match match, std::string message) {
  absl::MutexLock l(&mu_);
  faults_.push_back(Fault{std::move(match), absl::OkStatus(), true, std::move(message)});
}

void FaultInjectingRunner::SetHook(std::function<void(const KernelCall&)> hook) {
  absl::MutexLock l(&mu_);
  hook_ = std::move(hook);
}

int64_t FaultInjectingRunner::calls() const {
  absl::MutexLock l(&mu_);
  return calls_;
}

absl::Status FaultInjectingRunner::Inject(const KernelCall& call) {
  std::function<void(const KernelCall&)> hook;
  std::vector<Fault> faults;
  {
    absl::MutexLock l(&mu_);
    ++calls_;
    hook = hook_;
    faults = faults_;
  }
  if (hook) hook(call);
  for (const Fault& f : faults) {
    if (!f.match(call)) continue;
    if (f.do_throw) throw std::runtime_error(f.message);
    return f.status;
  }
  return absl::OkStatus();
}

FakeKernelRunner::FakeKernelRunner(DurationFn duration, ManualClock* clock)
    : duration_(std::move(duration)), clock_(clock) {}

absl::Status FakeKernelRunner::Run(const KernelCall& call) {
  absl::Status s = Inject(call);
  if (!s.ok()) return s;
  if (clock_ != nullptr && duration_) {
    const Duration d = duration_(call);
    if (d > Duration::Zero()) clock_->Advance(d);
  }
  return absl::OkStatus();
}

EmulatedKernelRunner::EmulatedKernelRunner(DurationFn ground_truth, Sleeper* sleeper)
    : ground_truth_(std::move(ground_truth)), sleeper_(sleeper) {}

absl::Status EmulatedKernelRunner::Run(const KernelCall& call) {
  absl::Status s = Inject(call);
  if (!s.ok()) return s;
  sleeper_->SleepFor(ground_truth_(call));
  return absl::OkStatus();
}

absl::Status HostTransferBackend::Send(const TransferCall& call) {
  {
    absl::MutexLock l(&mu_);
    for (const auto& [match, status] : faults_) {
      if (match(call)) return status;
    }
  }
  if (link_time_ && sleeper_ != nullptr) sleeper_->SleepFor(link_time_(call));
  const Buffer& from = *call.from;
  Buffer& to = *call.to;
  switch (from.kind) {
    case kNoPayload:
      to.kind = kNoPayload;
      to.payload.reset();
      return absl::OkStatus();
    case kHostBytesPayload: {
      const auto* src = static_cast<const HostBytes*>(from.payload.get());
      auto dst = std::make_shared<HostBytes>();
      if (src != nullptr) dst->data = src->data;
      to.kind = kHostBytesPayload;
      to.payload = std::move(dst);
      return absl::OkStatus();
    }
    default:
      return absl::UnimplementedError(StrCat("transfer ", call.node, " from ", call.src, " to ",
                                             call.dst, ": host backend cannot copy payload kind ",
                                             from.kind));
  }
}

void HostTransferBackend::FailWhen(std::function<bool(const TransferCall&)> match,
                                   absl::Status status) {
  absl::MutexLock l(&mu_);
  faults_.emplace_back(std::move(match), std::move(status));
}

}  // namespace slicesched::executor
