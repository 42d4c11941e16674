// Ymir's time estimator (../shared/papers/ymir.md §4.3): a look-up table
// from a training configuration to the seconds one
// optimizer iteration takes, profiled offline (the backbone is fixed, so no
// scaling law is fitted) and refined online from the executors' feedback.
//
// Keys: devices, gradient accumulation, local (per-device micro-)batch,
// frozen layers, AMP, gradient checkpointing and parallelism. The first four
// are NUMERIC axes (interpolable); AMP, checkpointing and parallelism are
// CATEGORICAL (never interpolated: a configuration with another value of one
// of them is a different program).
//
// Lookup. A key that was measured (profiled or updated online) is returned
// as is, interpolated = false. A missing key is interpolated multilinearly
// over the numeric axes, in the order local_batch, grad_accum,
// frozen_layers, devices, among the entries with the same categorical
// values: along an axis whose value was measured the lookup recurses with
// that value; otherwise it takes the two measured values around it (the two
// nearest on one side when outside the measured range: linear
// extrapolation, floored at half the nearer value) and recurses at both.
// The result is marked interpolated = true and `source` lists the measured
// keys it came from. NotFound when some corner the interpolation needs was
// not measured (e.g. an axis with a single measured value that differs), or
// nothing shares the categorical values.
//
// Online update from feedback: Update(key, observed) moves a measured entry
// to (1 - alpha) old + alpha observed (an EWMA) and counts the observation;
// an unmeasured key becomes a measured entry with the observed value.
//
// Files: CSV with the header
//   devices,grad_accum,local_batch,frozen_layers,amp,grad_checkpoint,parallelism,seconds,samples
// (amp / grad_checkpoint 0 or 1, parallelism "data" or "pipeline", samples =
// profiled iterations + online updates). Save writes entries in key order;
// Load rejects malformed rows naming the line.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"

namespace slicesched::ymir {

enum class Parallelism { kData, kPipeline };
const char* ParallelismName(Parallelism p);

struct LutKey {
  int64_t devices = 1;
  int64_t grad_accum = 1;
  int64_t local_batch = 1;
  int64_t frozen_layers = 0;
  bool amp = false;
  bool grad_checkpoint = false;
  Parallelism parallelism = Parallelism::kData;

  // devices, grad_accum, local_batch >= 1; frozen_layers >= 0.
  absl::Status Validate() const;
  std::string ToString() const;  // "d=2 ga=1 b=8 frozen=0 amp=0 ckpt=0 data"
  auto Tie() const {
    return std::tie(parallelism, amp, grad_checkpoint, devices, frozen_layers, grad_accum,
                    local_batch);
  }
  bool operator<(const LutKey& o) const { return Tie() < o.Tie(); }
  bool operator==(const LutKey& o) const { return Tie() == o.Tie(); }
};

struct LutEntry {
  double seconds = 0;   // per iteration (one optimizer step)
  int64_t samples = 0;  // observations behind it
};

struct LutLookup {
  double seconds = 0;
  bool interpolated = false;
  std::vector<LutKey> source;  // the measured keys used (just the key when exact)
};

class TimeLut {
 public:
  explicit TimeLut(double ewma_alpha = 0.2) : alpha_(ewma_alpha) {}

  // A profiled measurement (replaces the entry). seconds > 0, samples >= 1.
  absl::Status Set(const LutKey& key, double seconds, int64_t samples = 1);
  absl::StatusOr<LutLookup> Lookup(const LutKey& key) const;
  // Executor feedback: one observed iteration time (see above).
  absl::Status Update(const LutKey& key, double observed_seconds);

  const std::map<LutKey, LutEntry>& entries() const { return entries_; }
  double ewma_alpha() const { return alpha_; }

  std::string ToCsv() const;
  static absl::StatusOr<TimeLut> FromCsv(const std::string& csv, double ewma_alpha = 0.2);
  absl::Status Save(const std::string& path) const;
  static absl::StatusOr<TimeLut> Load(const std::string& path, double ewma_alpha = 0.2);

 private:
  absl::StatusOr<LutLookup> Interpolate(const LutKey& key, int axis) const;

  double alpha_;
  std::map<LutKey, LutEntry> entries_;
};

}  // namespace slicesched::ymir
