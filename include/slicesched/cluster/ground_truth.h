// The ground-truth cost model of the virtual-time cluster.
//
// This is what "the hardware" does in trace replay and in the accuracy
// experiment. It is deliberately NOT the estimators' model: operator times
// follow a roofline with a batch-dependent efficiency curve (non-linear in
// shape), every device has its own speed skew, every run has multiplicative
// noise, and work slows down while a transfer overlaps computation on the
// same device. The scheduler's estimators never read these parameters; they
// learn them online from feedback, as they would on hardware.
//
// Calibration (defaults): an NVIDIA A16-class device (one of the four GPUs of
// an A16 board: ~18 TFLOPS dense FP16, 200 GB/s GDDR6, whose fused 8-layer
// Llama3-8B decode operator at batch 1 takes ~10.6 ms in the paper, which the
// effective bandwidth below reproduces), PCIe-class links.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "slicesched/common/units.h"
#include "slicesched/gmg/accelerator.h"
#include "slicesched/gmg/graph_template.h"

namespace slicesched {

struct GroundTruthOptions {
  double peak_flops = 18e12;          // dense FP16 per device
  double mem_bandwidth = 340e9;       // effective bytes/s streaming weights (decode)
  double efficiency_half_tokens = 96; // tokens at which compute efficiency is half its max
  double max_efficiency = 0.62;
  double launch_ns_per_layer = 35e3;  // per-layer fixed cost (kernel launches, sync)
  double device_skew_pct = 4.0;       // each device's speed differs by up to this
  double noise_pct = 3.0;             // each run: uniform multiplicative noise +-
  double overlap_slowdown = 0.06;     // compute while a transfer touches the device
  double transfer_overlap_slowdown = 0.10;  // transfer while either end computes
  double link_efficiency = 0.85;      // achieved fraction of the link's nominal bandwidth
  double chunk_bytes = 4 << 20;       // transfers move in chunks ...
  double chunk_overhead_ns = 6e3;     // ... each with a fixed cost
  uint64_t seed = 7;                  // device skews
};

class GroundTruthModel {
 public:
  GroundTruthModel(const AcceleratorSet& accelerators, GroundTruthOptions options = {});

  // Time of one run of `op` of `tpl` with evaluated attributes `attrs` on
  // `device`; `overlapped` when a transfer is active on the device at start.
  Duration OpTime(const GraphTemplate& tpl, int op, std::span<const int64_t> attrs, DeviceId device,
                  bool overlapped, std::mt19937_64& rng) const;
  // Noise-free, skew-free time (for calibration reports and tests).
  double NominalOpNs(const GraphTemplate& tpl, int op, std::span<const int64_t> attrs) const;

  Duration TransferTime(DeviceId src, DeviceId dst, Bytes size, bool overlapped, std::mt19937_64& rng) const;
  double NominalTransferNs(DeviceId src, DeviceId dst, Bytes size) const;

  const GroundTruthOptions& options() const { return o_; }
  double skew(DeviceId d) const { return skew_[d.value()]; }

 private:
  double Noise(std::mt19937_64& rng) const;

  const AcceleratorSet* accel_;
  GroundTruthOptions o_;
  std::vector<double> skew_;  // per device time multiplier
};

}  // namespace slicesched
