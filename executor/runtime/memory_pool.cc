#include "slicesched/executor/runtime/memory_pool.h"

#include <utility>

#include "absl/base/internal/raw_logging.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

namespace slicesched::executor {

const char* AllocPurposeName(AllocPurpose p) {
  switch (p) {
    case AllocPurpose::kOutput: return "output";
    case AllocPurpose::kWorkspace: return "workspace";
    case AllocPurpose::kRecv: return "recv buffer";
    case AllocPurpose::kCheckpoint: return "checkpoint";
    case AllocPurpose::kOther: break;
  }
  return "buffer";
}

Allocation& Allocation::operator=(Allocation&& o) noexcept {
  if (this != &o) {
    Release();
    pool_ = o.pool_;
    bytes_ = o.bytes_;
    o.pool_ = nullptr;
  }
  return *this;
}

void Allocation::Release() {
  if (pool_ == nullptr) return;
  // A zero-byte allocation (an operator without workspace) charged nothing
  // and is not counted live: no lock round trip to give it back.
  if (bytes_ > Bytes::Zero()) pool_->Free(bytes_);
  pool_ = nullptr;
}

DevicePool::DevicePool(DeviceId device, std::string name, Bytes capacity)
    : device_(device), name_(std::move(name)), capacity_(capacity) {}

DevicePool::~DevicePool() {
  absl::MutexLock l(&mu_);
  ABSL_RAW_CHECK(live_ == 0, "DevicePool destroyed while allocations are live");
}

std::optional<absl::Status> DevicePool::TryLocked(Bytes bytes, AllocPurpose purpose, Allocation* out) {
  if (bytes < Bytes::Zero()) {
    return absl::InvalidArgumentError(
        StrCat("device ", name_, ": negative allocation of ", bytes.count(), " bytes"));
  }
  if (fail_next_ > 0 && (fail_next_any_purpose_ || fail_next_purpose_ == purpose)) {
    --fail_next_;
    ++failures_;
    return absl::ResourceExhaustedError(
        StrCat("device ", name_, ": cannot allocate ", AllocPurposeName(purpose), " of ", bytes,
               " (injected failure; ", capacity_ - used_, " free of ", capacity_, ")"));
  }
  // No hook (the serving path): account in this same critical section.
  if (!hook_) return AccountLocked(bytes, purpose, out);
  return std::nullopt;
}

absl::StatusOr<Allocation> DevicePool::Allocate(Bytes bytes, AllocPurpose purpose) {
  FailureHook hook;
  {
    absl::MutexLock l(&mu_);
    Allocation a;
    std::optional<absl::Status> done = TryLocked(bytes, purpose, &a);
    if (done.has_value()) {
      SLICESCHED_RETURN_IF_ERROR(*done);
      return a;
    }
    hook = hook_;
  }
  // The hook runs outside the lock so it may inspect the pool.
  if (hook && hook(AllocationRequest{device_, bytes, purpose})) {
    absl::MutexLock l(&mu_);
    ++failures_;
    return absl::ResourceExhaustedError(
        StrCat("device ", name_, ": cannot allocate ", AllocPurposeName(purpose), " of ", bytes,
               " (injected failure; ", capacity_ - used_, " free of ", capacity_, ")"));
  }
  absl::MutexLock l(&mu_);
  Allocation a;
  SLICESCHED_RETURN_IF_ERROR(AccountLocked(bytes, purpose, &a));
  return a;
}

absl::Status DevicePool::AllocateEach(std::span<const Request> requests, std::span<Allocation> out) {
  if (out.size() < requests.size()) {
    return absl::InvalidArgumentError(StrCat("device ", name_, ": AllocateEach of ", requests.size(),
                                             " requests into ", out.size(), " slots"));
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    if (out[i].held()) {
      return absl::InvalidArgumentError(
          StrCat("device ", name_, ": AllocateEach into slot ", i, ", which holds an allocation"));
    }
  }
  size_t i = 0;
  {
    absl::MutexLock l(&mu_);
    if (AccountAllLocked(requests, out)) return absl::OkStatus();
    for (; i < requests.size(); ++i) {
      std::optional<absl::Status> done = TryLocked(requests[i].bytes, requests[i].purpose, &out[i]);
      if (!done.has_value()) break;  // a hook: the rest one by one, below
      SLICESCHED_RETURN_IF_ERROR(*done);
    }
  }
  for (; i < requests.size(); ++i) {
    absl::StatusOr<Allocation> a = Allocate(requests[i].bytes, requests[i].purpose);
    if (!a.ok()) return a.status();
    out[i] = *std::move(a);
  }
  return absl::OkStatus();
}

bool DevicePool::AccountAllLocked(std::span<const Request> requests, std::span<Allocation> out) {
  if (hook_ || fail_next_ > 0) return false;
  Bytes total;
  for (const Request& r : requests) {
    if (r.bytes < Bytes::Zero()) return false;
    total += r.bytes;
  }
  if (used_ + total > capacity_) return false;
  // Each request fits in turn now (sizes are not negative): the one
  // accounting path, which cannot fail here.
  for (size_t i = 0; i < requests.size(); ++i) {
    AccountLocked(requests[i].bytes, requests[i].purpose, &out[i]).IgnoreError();
  }
  return true;
}

absl::Status DevicePool::AccountLocked(Bytes bytes, AllocPurpose purpose, Allocation* out) {
  if (used_ + bytes > capacity_) {
    ++failures_;
    return absl::ResourceExhaustedError(
        StrCat("device ", name_, ": out of memory allocating ", AllocPurposeName(purpose), " of ",
               bytes, " (", bytes.count(), " bytes requested, ", (capacity_ - used_).count(),
               " bytes free of ", capacity_.count(), ")"));
  }
  used_ += bytes;
  if (used_ > peak_) peak_ = used_;
  if (bytes > Bytes::Zero()) ++live_;  // (see Allocation::Release)
  ++allocations_;
  *out = Allocation(this, bytes);
  return absl::OkStatus();
}

void DevicePool::Free(Bytes bytes) {
  absl::MutexLock l(&mu_);
  used_ -= bytes;
  --live_;
}

Bytes DevicePool::used() const {
  absl::MutexLock l(&mu_);
  return used_;
}
Bytes DevicePool::free() const {
  absl::MutexLock l(&mu_);
  return capacity_ - used_;
}
Bytes DevicePool::peak() const {
  absl::MutexLock l(&mu_);
  return peak_;
}
void DevicePool::ResetPeak() {
  absl::MutexLock l(&mu_);
  peak_ = used_;
}
int64_t DevicePool::num_allocations() const {
  absl::MutexLock l(&mu_);
  return allocations_;
}
int64_t DevicePool::num_failures() const {
  absl::MutexLock l(&mu_);
  return failures_;
}
void DevicePool::FailNextAllocations(int n) {
  absl::MutexLock l(&mu_);
  fail_next_ = n;
  fail_next_any_purpose_ = true;
}
void DevicePool::FailNextAllocations(int n, AllocPurpose purpose) {
  absl::MutexLock l(&mu_);
  fail_next_ = n;
  fail_next_any_purpose_ = false;
  fail_next_purpose_ = purpose;
}
void DevicePool::SetFailureHook(FailureHook hook) {
  absl::MutexLock l(&mu_);
  hook_ = std::move(hook);
}

}  // namespace slicesched::executor
