// DevicePool: the byte budget of one device, as the executors see it.
//
// Every buffer an executor creates on a device (operator outputs, workspace,
// transfer receive buffers, checkpoint growth) is charged here first, so an
// allocation that would exceed the device's capacity fails cleanly with
// ResourceExhausted instead of crashing a kernel. The pool only counts bytes;
// the memory itself belongs to the kernel library (see kernel.h).
//
// Allocation is RAII: the bytes return to the pool when the Allocation is
// destroyed or Release()d. An Allocation must not outlive its pool.
//
// Thread-safe: device threads, transfer workers and the owner thread allocate
// and release concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "slicesched/common/ids.h"
#include "slicesched/common/units.h"

namespace slicesched::executor {

class DevicePool;

// What an allocation is for (reported in errors and to the failure hook).
enum class AllocPurpose : uint8_t { kOutput, kWorkspace, kRecv, kCheckpoint, kOther };
const char* AllocPurposeName(AllocPurpose p);

struct AllocationRequest {
  DeviceId device;
  Bytes bytes;
  AllocPurpose purpose = AllocPurpose::kOther;
};

class Allocation {
 public:
  Allocation() = default;
  ~Allocation() { Release(); }
  Allocation(Allocation&& o) noexcept : pool_(o.pool_), bytes_(o.bytes_) { o.pool_ = nullptr; }
  Allocation& operator=(Allocation&& o) noexcept;
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;

  Bytes bytes() const { return bytes_; }
  bool held() const { return pool_ != nullptr; }
  // Returns the bytes to the pool now (idempotent).
  void Release();

 private:
  friend class DevicePool;
  Allocation(DevicePool* pool, Bytes bytes) : pool_(pool), bytes_(bytes) {}
  DevicePool* pool_ = nullptr;
  Bytes bytes_;
};

class DevicePool {
 public:
  // Returns true to make the allocation fail (tests: injected faults).
  using FailureHook = std::function<bool(const AllocationRequest&)>;

  DevicePool(DeviceId device, std::string name, Bytes capacity);
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // Charges `bytes` (>= 0). ResourceExhausted naming the device, the request
  // and the free bytes when it does not fit (or when a fault is injected).
  absl::StatusOr<Allocation> Allocate(Bytes bytes, AllocPurpose purpose = AllocPurpose::kOther);
  // Allocate() for each request in order, into out[i], stopping at the first
  // failure (its status is returned; the allocations before it stay in
  // `out`). Without a failure hook (the serving path) all of them are
  // accounted in one critical section: an executor's outputs and workspace
  // cost one lock round trip, not one each. Same accounting, statistics,
  // injected failures and errors as the calls one by one. `out` holds at
  // least as many entries as `requests`, none of them held.
  struct Request {
    Bytes bytes;
    AllocPurpose purpose = AllocPurpose::kOther;
  };
  absl::Status AllocateEach(std::span<const Request> requests, std::span<Allocation> out);

  DeviceId device() const { return device_; }
  const std::string& name() const { return name_; }
  Bytes capacity() const { return capacity_; }
  Bytes used() const;
  Bytes free() const;
  // Highest used() seen since construction (or ResetPeak()).
  Bytes peak() const;
  void ResetPeak();
  // Allocations that succeeded / failed (including injected failures).
  int64_t num_allocations() const;
  int64_t num_failures() const;

  // Fault injection for tests: the next `n` allocations (matching `purpose`
  // when given) fail with ResourceExhausted.
  void FailNextAllocations(int n);
  void FailNextAllocations(int n, AllocPurpose purpose);
  // A general hook consulted on every allocation (after FailNext...).
  void SetFailureHook(FailureHook hook);

 private:
  // The negative-size and FailNext... checks, then (no hook) the accounting
  // into *out; with a hook, returns nullopt for the caller to consult it
  // outside the lock. A Status and an out-parameter, not a StatusOr: the
  // serving path allocates a few times per operator.
  std::optional<absl::Status> TryLocked(Bytes bytes, AllocPurpose purpose, Allocation* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AllocateEach's common case with one check for all: without a hook, an
  // injected failure or a negative size, and when the requests fit together
  // (each then fits in turn, as sizes are not negative), accounts each into
  // out[i] through AccountLocked and returns true (TryLocked's per-request
  // checks skipped; the same statistics as one by one). Otherwise
  // changes nothing and returns false (the caller goes request by request,
  // for the same errors).
  bool AccountAllLocked(std::span<const Request> requests, std::span<Allocation> out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks the capacity and records the allocation into *out.
  absl::Status AccountLocked(Bytes bytes, AllocPurpose purpose, Allocation* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  friend class Allocation;
  void Free(Bytes bytes);

  const DeviceId device_;
  const std::string name_;
  const Bytes capacity_;
  mutable absl::Mutex mu_;
  Bytes used_ ABSL_GUARDED_BY(mu_);
  Bytes peak_ ABSL_GUARDED_BY(mu_);
  int64_t live_ ABSL_GUARDED_BY(mu_) = 0;  // allocations of more than zero bytes
  int64_t allocations_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_next_ ABSL_GUARDED_BY(mu_) = 0;
  bool fail_next_any_purpose_ ABSL_GUARDED_BY(mu_) = true;
  AllocPurpose fail_next_purpose_ ABSL_GUARDED_BY(mu_) = AllocPurpose::kOther;
  FailureHook hook_ ABSL_GUARDED_BY(mu_);
};

}  // namespace slicesched::executor
