// The accelerator set: the devices of one server and the links between them.
//
// Devices are numbered densely from 0 in the order the configuration lists
// them. The link table holds a prior (bandwidth, latency) for every ordered
// pair of distinct devices; the transfer estimator starts from these priors
// and refines them with observations.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "slicesched/common/config.h"
#include "slicesched/common/ids.h"
#include "slicesched/common/units.h"

namespace slicesched {

enum class DeviceBackend : uint8_t {
  kCpu,       // LibTorch on host memory, one thread per device
  kCuda,      // LibTorch on a CUDA device, NCCL transfers
  kEmulated,  // real-time emulation from a ground-truth cost model
  kVirtual,   // virtual-time cluster model for trace replay
};
absl::string_view DeviceBackendName(DeviceBackend b);
absl::StatusOr<DeviceBackend> ParseDeviceBackend(absl::string_view name);

struct DeviceSpec {
  DeviceId id;
  std::string name;   // unique, e.g. "gpu3"
  std::string type;   // estimator key, e.g. "A16", "cpu"
  Bytes memory;       // capacity available to slicesched
  DeviceBackend backend = DeviceBackend::kVirtual;
  int ordinal = 0;    // cuda: the CUDA device index (config key `device`); two logical devices may share one
};

struct LinkSpec {
  double bandwidth_bytes_per_s = 0;
  Duration latency;
  // Prior transfer time for `size` bytes: latency + size / bandwidth.
  Duration TransferTime(Bytes size) const {
    return latency + Duration::FromSecondsF(static_cast<double>(size.count()) /
                                            bandwidth_bytes_per_s);
  }
};

class AcceleratorSet {
 public:
  // Validates names (unique, non-empty), capacities (> 0) and links
  // (bandwidth > 0, latency >= 0, endpoints distinct and known).
  static absl::StatusOr<AcceleratorSet> Create(std::vector<DeviceSpec> devices,
                                               LinkSpec default_link);

  // Parses a `cluster:` section:
  //   devices: [{name: gpu, count: 8, type: A16, memory: 64GiB, backend: virtual}]
  //   (backend: cuda takes `device: 0`, the first CUDA device index, or a
  //   list of one index per device)
  //   links:
  //     default: {bandwidth: 12GB/s, latency: 20us}
  //     pairs: [{between: [gpu0, gpu1], bandwidth: 24GB/s, latency: 8us}]
  // A device entry with `count: N` expands to NAME0..NAME{N-1}. Errors go to
  // `errors` with positions; the returned set is valid only if errors->ok().
  static AcceleratorSet FromConfig(const ConfigReader& cluster, ConfigErrors* errors);

  size_t size() const { return devices_.size(); }
  const DeviceSpec& device(DeviceId id) const { return devices_[id.value()]; }
  const std::vector<DeviceSpec>& devices() const { return devices_; }
  absl::StatusOr<DeviceId> FindDevice(absl::string_view name) const;
  const LinkSpec& link(DeviceId src, DeviceId dst) const {
    return links_[src.value() * devices_.size() + dst.value()];
  }
  absl::Status SetLink(DeviceId a, DeviceId b, LinkSpec link);  // both directions

 private:
  std::vector<DeviceSpec> devices_;
  std::vector<LinkSpec> links_;  // row-major [src][dst]
};

// Parses "12GB/s", "25 GiB/s" or a plain number of bytes per second.
absl::StatusOr<double> ParseBandwidth(absl::string_view text);

}  // namespace slicesched
