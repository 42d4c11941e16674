// The narrow interface between the executors and operator implementations.
//
// The executor runtime knows nothing about tensors: it hands a kernel library
// a KernelCall naming the GMG node, the template op and its evaluated
// attributes, the device, and opaque Buffers for the inputs and outputs. A
// Buffer is a byte count (charged to the device's DevicePool by the executor)
// plus a payload the kernel library owns and interprets: a LibTorch kernel
// library stores a torch::Tensor there; the fakes below store nothing.
//
// This header must stay free of LibTorch: LibTorch kernels implement
// KernelRunner in their own translation units under executor/.
//
// Threading: Run() is called concurrently from every device thread (one call
// per device at a time). Implementations must be thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "slicesched/common/clock.h"
#include "slicesched/common/ids.h"
#include "slicesched/common/units.h"
#include "slicesched/gmg/graph_template.h"

namespace slicesched::executor {

// Payload kinds. Kernel libraries pick their own values >= kFirstLibraryPayload.
enum : uint32_t {
  kNoPayload = 0,         // bytes are only accounted (fakes, emulation)
  kHostBytesPayload = 1,  // payload points to a HostBytes (host memory)
  kCudaBytesPayload = 2,  // payload points to a CudaBytes (nccl_transfer.h)
  kFirstLibraryPayload = 100,
};

// Host memory owned by a Buffer (CPU devices, HostTransferBackend).
struct HostBytes {
  std::vector<std::byte> data;
};

// One tensor as the runtime sees it.
struct Buffer {
  Bytes bytes;
  DeviceId device;
  uint32_t kind = kNoPayload;
  std::shared_ptr<void> payload;  // owned by the kernel library; may be null
};

struct KernelCall {
  NodeId node;
  InstanceId instance;
  const GraphTemplate* tpl = nullptr;
  int op_index = -1;
  std::span<const int64_t> attrs;  // evaluated template attributes
  DeviceId device;
  // One per op input, in OpSpec::inputs order: op outputs (local copies),
  // external inputs (empty Buffers) and checkpoint inputs.
  std::span<const Buffer> inputs;
  // One per op output, sized and placed; the kernel fills the payloads.
  std::span<Buffer> outputs;
  Bytes workspace;

  const OpSpec& op() const { return tpl->op(op_index); }
};

class KernelRunner {
 public:
  virtual ~KernelRunner() = default;
  // Runs the operator to completion. An error (or an exception, which the
  // executor catches) fails the node's instance with the message.
  virtual absl::Status Run(const KernelCall& call) = 0;
};
using Kernel = KernelRunner;

// Something that lets time pass (the emulated executors' "kernel").
class Sleeper {
 public:
  virtual ~Sleeper() = default;
  virtual void SleepFor(Duration d) = 0;
};
// absl::SleepFor (real time; yields the CPU).
class RealSleeper final : public Sleeper {
 public:
  void SleepFor(Duration d) override;
};
// Busy-waits on a clock (real time, precise; burns the CPU like a kernel).
class SpinSleeper final : public Sleeper {
 public:
  explicit SpinSleeper(const Clock* clock) : clock_(clock) {}
  void SleepFor(Duration d) override;

 private:
  const Clock* clock_;
};
// Advances a ManualClock (virtual time; for deterministic tests).
class ManualClockSleeper final : public Sleeper {
 public:
  explicit ManualClockSleeper(ManualClock* clock) : clock_(clock) {}
  void SleepFor(Duration d) override;

 private:
  ManualClock* clock_;
};

// Fault injection shared by the fake and emulated runners.
class FaultInjectingRunner : public KernelRunner {
 public:
  using Match = std::function<bool(const KernelCall&)>;
  // Calls matching `match` return `status` (not OK).
  void FailWhen(Match match, absl::Status status);
  // Calls matching `match` throw std::runtime_error(message).
  void ThrowWhen(Match match, std::string message);
  // Called at the start of every Run (tests: observe or gate kernels).
  void SetHook(std::function<void(const KernelCall&)> hook);
  int64_t calls() const;

 protected:
  // Applies the hook and the faults; returns the injected error, throws the
  // injected exception, or OK.
  absl::Status Inject(const KernelCall& call);

 private:
  struct Fault {
    Match match;
    absl::Status status;
    bool do_throw = false;
    std::string message;
  };
  mutable absl::Mutex mu_;
  std::vector<Fault> faults_ ABSL_GUARDED_BY(mu_);
  std::function<void(const KernelCall&)> hook_ ABSL_GUARDED_BY(mu_);
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
};

using DurationFn = std::function<Duration(const KernelCall&)>;

// For tests: takes `duration(call)` of virtual time by advancing a
// ManualClock (or no time when `clock` is null). Writes no payloads.
class FakeKernelRunner final : public FaultInjectingRunner {
 public:
  FakeKernelRunner(DurationFn duration, ManualClock* clock);
  absl::Status Run(const KernelCall& call) override;

 private:
  DurationFn duration_;
  ManualClock* clock_;
};

// The real-time emulated executors of the design: each operator takes its
// ground-truth time, spent on the injected Sleeper.
class EmulatedKernelRunner final : public FaultInjectingRunner {
 public:
  EmulatedKernelRunner(DurationFn ground_truth, Sleeper* sleeper);
  absl::Status Run(const KernelCall& call) override;

 private:
  DurationFn ground_truth_;
  Sleeper* sleeper_;
};

// ---- transfers -----------------------------------------------------------

struct TransferCall {
  NodeId node;  // the GMG transfer node
  DeviceId src, dst;
  Bytes bytes;
  const Buffer* from = nullptr;  // the tensor's copy on src
  Buffer* to = nullptr;          // the receive buffer on dst (allocated)
};

class TransferBackend {
 public:
  virtual ~TransferBackend() = default;
  // The source's Send: copies `from` into `to`. Called from a transfer
  // worker thread, only after the destination's Recv allocated `to`.
  virtual absl::Status Send(const TransferCall& call) = 0;
};

// Host-memory copies for CPU devices: a kHostBytesPayload is deep-copied, a
// buffer without payload moves no bytes; other payload kinds are
// Unimplemented (their kernel library brings its own backend). An optional
// Sleeper and duration emulate the link time.
class HostTransferBackend final : public TransferBackend {
 public:
  HostTransferBackend() = default;
  HostTransferBackend(std::function<Duration(const TransferCall&)> link_time, Sleeper* sleeper)
      : link_time_(std::move(link_time)), sleeper_(sleeper) {}
  absl::Status Send(const TransferCall& call) override;
  // Sends matching `match` fail with `status`.
  void FailWhen(std::function<bool(const TransferCall&)> match, absl::Status status);

 private:
  std::function<Duration(const TransferCall&)> link_time_;
  Sleeper* sleeper_ = nullptr;
  absl::Mutex mu_;
  std::vector<std::pair<std::function<bool(const TransferCall&)>, absl::Status>> faults_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace slicesched::executor
