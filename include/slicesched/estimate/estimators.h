// Estimators: predicted operator and transfer times, learned online.
//
// Transfer (paper Eq 1): per ordered (source, destination) device pair,
//   t = alpha * size + c,
// fitted by least squares over a bounded window of recent observations and
// seeded from the link table's priors (latency, 1 / bandwidth). Until the
// window holds two distinct sizes the slope is not identifiable: the prior's
// slope (or an earlier fit's) is kept and only c is learned, as the mean of
// t - alpha * size (a pair that only ever moves one size, a pipeline's
// activations, would otherwise keep the link table's latency for ever; on
// the fidelity rig that under-predicted its 0.4 ms hop 4x). The fit, like the operator fit,
// minimises relative error (weights 1 / t^2) under alpha >= 0, c >= 0 (NNLS),
// so the latency term that dominates small transfers is not drowned by the
// large ones.
//
// Operator (paper Eq 2): per (device type, template, template op) key, linear
// in a feature basis chosen by the op kind (see FeatureBasis), fitted by
// non-negative least squares (coefficients >= 0, so every prediction is >= 0)
// on relative error (each sample weighted by 1 / t^2, which is what MAPE
// measures) over a bounded window. Until a key has as many samples as
// features, predictions come from the key's prior (SetPrior) or, failing
// that, the configured default duration.
//
// Both fits are then made mean-unbiased: the coefficients are scaled by one
// factor so that the window's predicted total equals its measured total.
// The relative fit alone settles below the mean of noisy measurements (for
// a shape that repeats, at sum(1/t) / sum(1/t^2), below even the harmonic
// mean), so the sum of an iteration's predicted operators came out short of
// its mean; and RuntimeCalibration, which learns ratios of mean times, must
// agree with the estimators on what an unbiased model is (calibration.h).
// Without noise the factor is 1 and the fit is unchanged.
//
// Both keep, per key, the sample count and the MAPE of their predictions
// measured *before* each observation was added (an honest online error), and
// save/restore their coefficients as YAML so a restarted daemon starts warm.
//
// The hot path (Predict) does no allocation and no hashing: callers resolve a
// key to a dense handle once (Register) and keep it. Observe refits the key
// (a few microseconds for a 256-sample window). Neither class is thread-safe.
//
// Saved state holds coefficients, priors, sample counts and MAPE, not the
// windows: after Restore a key keeps its restored coefficients until it has
// collected enough new samples to refit.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "slicesched/common/units.h"
#include "slicesched/gmg/accelerator.h"
#include "slicesched/gmg/graph_template.h"

namespace slicesched {

inline constexpr int kMaxFeatures = 6;

struct Features {
  std::array<double, kMaxFeatures> v{};
  int n = 0;
};

// The feature basis of one template op, chosen by its kind, reading the op's
// evaluated integer attributes (GraphTemplate attrs, in declaration order):
//   matmul          attrs b, m, n, k:           [b*m*n*k, b*m*k, b*k*n, b*m*n, 1]
//   fused_layers,   attrs batch (B), new_tokens (S), context (C):
//   train_forward,    [B*S, B*S*(C+S), B*(C+S), 1]
//   train_backward    (GEMM FLOPs, attention FLOPs, KV bytes read, launch)
//   embedding,      [B*S, 1]
//   train_loss
//   lm_head, sample [B, 1]
//   anything else   [1]
// A missing attribute counts as 1 (batch) or 0 (context).
class FeatureBasis {
 public:
  static FeatureBasis For(const OpSpec& op);
  int size() const { return size_; }
  Features Compute(std::span<const int64_t> attrs) const;
  // coeffs . Compute(attrs), summed from the first feature on: the same
  // arithmetic in the same order (so bit-identical), without materialising
  // the features (the prediction path).
  // Inline (below): the simulator evaluates it once per node it builds.
  inline double Dot(const double* coeffs, std::span<const int64_t> attrs) const;
  std::vector<std::string> names() const;
  bool operator==(const FeatureBasis&) const = default;

 private:
  enum class Kind : uint8_t { kConstant, kMatmul, kLayers, kTokens, kBatch };
  Kind kind_ = Kind::kConstant;
  int size_ = 1;
  // Attribute positions (or -1): b, m, n, k for matmul; batch, new_tokens,
  // context for the others.
  std::array<int, 4> pos_{-1, -1, -1, -1};
};

double FeatureBasis::Dot(const double* c, std::span<const int64_t> attrs) const {
  // Mirrors Compute() feature by feature, summing from t = 0 in feature
  // order as PredictNs's dot product did: bit-identical results.
  auto at = [&](int s, double missing) {
    const int p = pos_[s];
    return p >= 0 && static_cast<size_t>(p) < attrs.size() ? static_cast<double>(attrs[p]) : missing;
  };
  double t = 0;
  switch (kind_) {
    case Kind::kMatmul: {
      const double b = at(0, 1), m = at(1, 1), n = at(2, 1), k = at(3, 1);
      t += c[0] * (b * m * n * k);
      t += c[1] * (b * m * k);
      t += c[2] * (b * k * n);
      t += c[3] * (b * m * n);
      t += c[4] * 1.0;
      break;
    }
    case Kind::kLayers: {
      const double batch = at(0, 1), s = at(1, 1), ctx = at(2, 0);
      t += c[0] * (batch * s);
      t += c[1] * (batch * s * (ctx + s));
      t += c[2] * (batch * (ctx + s));
      t += c[3] * 1.0;
      break;
    }
    case Kind::kTokens:
      t += c[0] * (at(0, 1) * at(1, 1));
      t += c[1] * 1.0;
      break;
    case Kind::kBatch:
      t += c[0] * at(0, 1);
      t += c[1] * 1.0;
      break;
    case Kind::kConstant:
      t += c[0] * 1.0;
      break;
  }
  return t;
}

struct OpEstimatorOptions {
  int window = 256;                               // samples kept per key
  Duration default_duration = Duration::Millis(1);  // no prior, no fit
};

class OpEstimator {
 public:
  explicit OpEstimator(OpEstimatorOptions options = {});
  ~OpEstimator();
  OpEstimator(OpEstimator&&) noexcept;
  OpEstimator& operator=(OpEstimator&&) noexcept;

  // Dense handle for (device type, template op); idempotent. -1 when `op` is
  // not an op of `tpl`. A key restored earlier (Restore) with the same names
  // and feature basis starts from the restored state. An op with a cost_of
  // (OpSpec) shares the key of the op it names when both read their
  // attributes into the same feature basis: a chunked prefill's pieces then
  // predict from the first request of any length on, instead of the default
  // duration until each template's own ops have been measured (which made
  // a rare template's long prompt look free to the what-if). Where the bases
  // differ, each keeps a key of its own.
  int Register(std::string_view device_type, const GraphTemplate& tpl, int op);
  int num_keys() const;

  // Predicted duration in nanoseconds; never negative. `attrs` are the op's
  // evaluated attributes in declaration order. An unknown key predicts the
  // default duration.
  double PredictNs(int key, std::span<const int64_t> attrs) const;
  Duration Predict(int key, std::span<const int64_t> attrs) const;
  // The model behind PredictNs, for callers that predict many nodes (the
  // simulator's construction): for a registered key, PredictNs(key, attrs)
  // is t = basis->Dot(coeffs, attrs) clamped to t > 0 ? t : 0. False for an
  // unknown key. The pointers stay valid until the next Register or Restore
  // (Observe refits the coefficients in place).
  bool LinearModel(int key, const FeatureBasis** basis, const double** coeffs) const;

  // True when the key predicts from a model: fitted, restored fitted, or
  // given a prior. False for an unknown key and for one still predicting the
  // default duration (whose ratio to a measurement says nothing about the
  // device; RuntimeCalibration must not learn from it).
  bool HasModel(int key) const;

  // Adds a measurement and refits the key.
  void Observe(int key, std::span<const int64_t> attrs, Duration measured);
  // Prior coefficients (one per basis feature, nanoseconds per unit; finite
  // and >= 0). Used until the key is fitted.
  absl::Status SetPrior(int key, std::span<const double> coeffs);

  struct KeyStats {
    std::string device_type, template_name, op_name;
    std::vector<std::string> feature_names;
    std::vector<double> coeffs;
    int64_t samples = 0;
    double mape_pct = 0;  // of predictions made before each sample
    bool fitted = false;
  };
  // Registered keys in handle order; coeffs are those in use (fit, prior, or
  // [0, ..., default duration]).
  std::vector<KeyStats> Stats() const;

  // YAML text with every key's coefficients, counts and MAPE (keys restored
  // but not registered yet included).
  std::string Save() const;
  // Restores keys saved by Save(); keys are matched by name when registered
  // later, so Restore may run before Register. Malformed text, or a saved
  // basis that differs from a registered key's, gives InvalidArgumentError
  // listing every problem, and nothing changes.
  absl::Status Restore(std::string_view text);

 private:
  struct Key;  // defined in the .cc
  // A key's state as read by Restore(): applied at once to a registered key,
  // or kept in pending_ until Register() creates the key.
  struct Restored {
    std::string device_type, template_name, op_name;
    std::vector<std::string> feature_names;
    std::vector<double> coeffs;  // coefficients in use when saved
    std::vector<double> prior;   // empty: no prior was set
    bool fitted = false;
    int64_t samples = 0;
    double mape_pct = 0;
  };
  void Refit(Key& key);
  void ResetCoeffs(Key& key) const;  // prior if set, else the default duration
  void Apply(const Restored& restored, Key& key) const;

  OpEstimatorOptions options_;
  std::vector<Key> keys_;
  absl::flat_hash_map<std::string, int> by_name_;  // "type|template|op" -> key
  absl::flat_hash_map<std::string, Restored> pending_;  // restored, not registered
};

struct TransferEstimatorOptions {
  int window = 128;
  // Weight of a new sample in the hand-off gap means (see "Hand-off gaps").
  double handoff_smoothing = 0.05;
};

class TransferEstimator {
 public:
  TransferEstimator(const AcceleratorSet& accelerators, TransferEstimatorOptions options = {});
  ~TransferEstimator();
  TransferEstimator(TransferEstimator&&) noexcept;
  TransferEstimator& operator=(TransferEstimator&&) noexcept;

  // What a cross-device hop delays its consumer by: the link time plus the
  // learned hand-off gaps of the pair (below). 0 when src == dst (or either
  // id is out of range).
  double PredictNs(DeviceId src, DeviceId dst, int64_t bytes) const;
  Duration Predict(DeviceId src, DeviceId dst, Bytes size) const;
  // The link time alone (the fitted alpha * bytes + c): how long a transfer
  // holds its ends (the simulator's transfer duration), and what a
  // transfer's own start-to-end measurement is compared with.
  double PredictLinkNs(DeviceId src, DeviceId dst, int64_t bytes) const;
  // Same-device (and out-of-range) observations are ignored. `measured` is
  // the transfer's start to end (no hand-off gaps).
  void Observe(DeviceId src, DeviceId dst, Bytes size, Duration measured);

  // ---- Hand-off gaps ----------------------------------------------------
  // On real executors a hop costs more than the link time: the master has to
  // learn that the producer finished and arbitrate the transfer (the
  // *launch* gap: producer end to transfer start, beyond any wait for a busy
  // end) and, once the bytes are there, hand the consumer to its device (the
  // *delivery* gap: transfer end to consumer start on an idle device). The
  // link model cannot see either. They are learned from executor feedback
  // (OnlineLearner: Feedback::handoff) as exponentially weighted means, the
  // launch gap per (src, dst) pair and the delivery gap per destination.
  // PredictNs adds both to the link time; the simulator holds the transfer
  // slots for the link time only and delivers the bytes to the consumer
  // launch_gap_ns + delivery_gap_ns later (the master's hand-offs overlap
  // other transfers; a transfer running in a snapshot still gets its launch
  // gap after its link time, a small overestimate). Both are 0 until
  // observed (backends without a master hand-off never report them);
  // negative samples count as 0, out-of-range devices are ignored. They
  // describe the running master, not the links: Save() does not keep them.
  void ObserveLaunchGap(DeviceId src, DeviceId dst, Duration gap);
  void ObserveDeliveryGap(DeviceId dst, Duration gap);
  double launch_gap_ns(DeviceId src, DeviceId dst) const;
  double delivery_gap_ns(DeviceId dst) const;
  // False until a gap of either kind has been observed (for any device):
  // then every gap above is 0, and a caller on a hot path (the simulator's
  // transfer completions) may skip asking for them.
  bool handoff_gaps_observed() const { return gaps_observed_; }

  struct PairStats {
    std::string src, dst;
    double alpha_ns_per_byte = 0, c_ns = 0;
    int64_t samples = 0;
    double mape_pct = 0;
  };
  std::vector<PairStats> Stats() const;  // pairs with at least one sample
  // YAML text keyed by device names (pairs with samples only).
  std::string Save() const;
  // All or nothing; unknown device names are an InvalidArgumentError.
  absl::Status Restore(std::string_view text);

 private:
  struct Pair;  // defined in the .cc
  void Refit(Pair& pair);
  TransferEstimatorOptions options_;
  std::vector<std::string> names_;
  std::vector<Pair> pairs_;  // row-major [src][dst]
  struct Gap {
    double mean_ns = 0;
    int64_t samples = 0;
  };
  void StepGap(Gap& g, Duration gap) const;
  std::vector<Gap> launch_;    // row-major [src][dst]
  std::vector<Gap> delivery_;  // by destination
  bool gaps_observed_ = false;  // some Gap above has a sample
};

// Error accounting shared by both estimators.
struct MapeCounter {
  int64_t n = 0;
  double sum_abs_pct = 0;
  // Adds |predicted - actual| / actual * 100; ignored when actual <= 0.
  void Add(double predicted, double actual);
  double mape_pct() const { return n == 0 ? 0.0 : sum_abs_pct / static_cast<double>(n); }
};

}  // namespace slicesched
