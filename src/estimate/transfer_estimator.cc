// TransferEstimator (slicesched/estimate/estimators.h): per device pair, a
// transfer's time as alpha * bytes + c, fitted online by the relative-error
// NNLS that OpEstimator uses (estimators_internal.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "estimators_internal.h"
#include "slicesched/common/config.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/estimate/estimators.h"
#include "yaml-cpp/yaml.h"

namespace slicesched {
namespace {

constexpr absl::string_view kTransferSource = "<transfer estimator state>";

}  // namespace

struct TransferEstimator::Pair {
  // t = alpha * bytes + c, in use: the fit, else the link prior.
  double alpha = 0, c = 0;
  double prior_alpha = 0, prior_c = 0;
  bool fitted = false;
  // Ring buffer of (bytes, ns), allocated on the first observation.
  std::vector<double> bytes;
  std::vector<double> t;
  int next = 0;
  int count = 0;
  int64_t samples = 0;
  MapeCounter mape;
};

TransferEstimator::TransferEstimator(const AcceleratorSet& accelerators,
                                     TransferEstimatorOptions options)
    : options_(options) {
  options_.window = std::max(options_.window, 2);
  if (!(options_.handoff_smoothing > 0.0 && options_.handoff_smoothing <= 1.0)) {
    options_.handoff_smoothing = TransferEstimatorOptions{}.handoff_smoothing;
  }
  const size_t n = accelerators.size();
  names_.reserve(n);
  for (const DeviceSpec& d : accelerators.devices()) names_.push_back(d.name);
  pairs_.resize(n * n);
  launch_.resize(n * n);
  delivery_.resize(n);
  for (size_t s = 0; s < n; ++s) {
    for (size_t d = 0; d < n; ++d) {
      if (s == d) continue;
      const LinkSpec& link = accelerators.link(DeviceId(static_cast<uint16_t>(s)),
                                               DeviceId(static_cast<uint16_t>(d)));
      Pair& p = pairs_[s * n + d];
      // Prior: c = latency, alpha = 1 / bandwidth (ns per byte).
      p.prior_c = std::max(0.0, static_cast<double>(link.latency.nanos()));
      p.prior_alpha = link.bandwidth_bytes_per_s > 0 ? 1e9 / link.bandwidth_bytes_per_s : 0.0;
      p.alpha = p.prior_alpha;
      p.c = p.prior_c;
    }
  }
}
TransferEstimator::~TransferEstimator() = default;
TransferEstimator::TransferEstimator(TransferEstimator&&) noexcept = default;
TransferEstimator& TransferEstimator::operator=(TransferEstimator&&) noexcept = default;

double TransferEstimator::PredictLinkNs(DeviceId src, DeviceId dst, int64_t bytes) const {
  const size_t n = names_.size();
  if (src == dst || !src.valid() || !dst.valid() || src.value() >= n || dst.value() >= n) {
    return 0.0;
  }
  const Pair& p = pairs_[src.value() * n + dst.value()];
  const double t = p.alpha * static_cast<double>(bytes) + p.c;
  return t > 0 ? t : 0.0;
}

double TransferEstimator::PredictNs(DeviceId src, DeviceId dst, int64_t bytes) const {
  const size_t n = names_.size();
  if (src == dst || !src.valid() || !dst.valid() || src.value() >= n || dst.value() >= n) {
    return 0.0;
  }
  return PredictLinkNs(src, dst, bytes) + launch_[src.value() * n + dst.value()].mean_ns +
         delivery_[dst.value()].mean_ns;
}

void TransferEstimator::StepGap(Gap& g, Duration gap) const {
  const double x = std::max(0.0, static_cast<double>(gap.nanos()));
  // The first sample is the mean; then an exponentially weighted mean (the
  // master's load drifts, so old samples should fade).
  g.mean_ns = g.samples == 0 ? x : g.mean_ns + options_.handoff_smoothing * (x - g.mean_ns);
  ++g.samples;
}

void TransferEstimator::ObserveLaunchGap(DeviceId src, DeviceId dst, Duration gap) {
  const size_t n = names_.size();
  if (src == dst || !src.valid() || !dst.valid() || src.value() >= n || dst.value() >= n) return;
  StepGap(launch_[src.value() * n + dst.value()], gap);
  gaps_observed_ = true;
}

void TransferEstimator::ObserveDeliveryGap(DeviceId dst, Duration gap) {
  if (!dst.valid() || dst.value() >= names_.size()) return;
  StepGap(delivery_[dst.value()], gap);
  gaps_observed_ = true;
}

double TransferEstimator::launch_gap_ns(DeviceId src, DeviceId dst) const {
  const size_t n = names_.size();
  if (src == dst || !src.valid() || !dst.valid() || src.value() >= n || dst.value() >= n) return 0.0;
  return launch_[src.value() * n + dst.value()].mean_ns;
}

double TransferEstimator::delivery_gap_ns(DeviceId dst) const {
  if (!dst.valid() || dst.value() >= names_.size()) return 0.0;
  return delivery_[dst.value()].mean_ns;
}

Duration TransferEstimator::Predict(DeviceId src, DeviceId dst, Bytes size) const {
  return estimate_internal::NanosToDuration(PredictNs(src, dst, size.count()));
}

void TransferEstimator::Observe(DeviceId src, DeviceId dst, Bytes size, Duration measured) {
  const size_t n = names_.size();
  if (src == dst || !src.valid() || !dst.valid() || src.value() >= n || dst.value() >= n) return;
  Pair& p = pairs_[src.value() * n + dst.value()];
  const double t = estimate_internal::MeasuredNs(measured);
  p.mape.Add(PredictLinkNs(src, dst, size.count()), t);
  ++p.samples;
  if (p.t.empty()) {
    p.bytes.resize(options_.window);
    p.t.resize(options_.window);
  }
  p.bytes[p.next] = static_cast<double>(std::max<int64_t>(0, size.count()));
  p.t[p.next] = t;
  p.next = (p.next + 1) % options_.window;
  p.count = std::min(p.count + 1, options_.window);
  Refit(p);
}

void TransferEstimator::Refit(Pair& p) {
  // Slope and intercept are identifiable only with two distinct sizes. With
  // one, the slope in use (the link prior's, or an earlier fit's) stays and
  // only the constant is learned, as the mean of t - alpha * size: a pair
  // that only ever moves one size (a pipeline's activations) still learns
  // what its transfers take, not the link table's latency.
  bool distinct = false;
  for (int i = 1; i < p.count && !distinct; ++i) distinct = p.bytes[i] != p.bytes[0];
  if (!distinct) {
    if (p.count == 0) return;
    double residual = 0;
    for (int i = 0; i < p.count; ++i) residual += p.t[i] - p.alpha * p.bytes[i];
    p.c = std::max(0.0, residual / p.count);
    p.fitted = true;
    return;
  }
  // Relative weighting (1 / t^2), as for operators: transfers span 4 KiB to
  // GiBs, and unweighted least squares would let the largest ones drown the
  // latency term that dominates small transfers. The NNLS bounds alpha >= 0
  // and c >= 0 exactly (the constrained optimum, not a clamp of the
  // unconstrained one).
  std::vector<double> x(static_cast<size_t>(p.count) * 2);
  for (int i = 0; i < p.count; ++i) {
    x[2 * i] = p.bytes[i];
    x[2 * i + 1] = 1.0;
  }
  std::vector<double> scratch;
  double beta[2] = {p.alpha, p.c};
  if (!estimate_internal::FitRelativeNnls(x.data(), p.t.data(), p.count, 2, scratch, beta)) return;
  estimate_internal::MeanUnbias(x.data(), p.t.data(), p.count, 2, beta);
  p.alpha = beta[0];
  p.c = beta[1];
  p.fitted = true;
}

std::vector<TransferEstimator::PairStats> TransferEstimator::Stats() const {
  std::vector<PairStats> out;
  const size_t n = names_.size();
  for (size_t s = 0; s < n; ++s) {
    for (size_t d = 0; d < n; ++d) {
      const Pair& p = pairs_[s * n + d];
      if (s == d || p.samples == 0) continue;
      PairStats st;
      st.src = names_[s];
      st.dst = names_[d];
      st.alpha_ns_per_byte = p.alpha;
      st.c_ns = p.c;
      st.samples = p.samples;
      st.mape_pct = p.mape.mape_pct();
      out.push_back(std::move(st));
    }
  }
  return out;
}

std::string TransferEstimator::Save() const {
  YAML::Emitter out;
  out.SetDoublePrecision(std::numeric_limits<double>::max_digits10);
  out << YAML::BeginMap << YAML::Key << "version" << YAML::Value << estimate_internal::kStateVersion;
  out << YAML::Key << "transfers" << YAML::Value << YAML::BeginSeq;
  const size_t n = names_.size();
  for (size_t s = 0; s < n; ++s) {
    for (size_t d = 0; d < n; ++d) {
      const Pair& p = pairs_[s * n + d];
      if (s == d || (p.samples == 0 && !p.fitted)) continue;
      out << YAML::BeginMap;
      out << YAML::Key << "src" << YAML::Value << names_[s];
      out << YAML::Key << "dst" << YAML::Value << names_[d];
      out << YAML::Key << "alpha_ns_per_byte" << YAML::Value << p.alpha;
      out << YAML::Key << "c_ns" << YAML::Value << p.c;
      out << YAML::Key << "fitted" << YAML::Value << p.fitted;
      out << YAML::Key << "samples" << YAML::Value << p.samples;
      out << YAML::Key << "mape_pct" << YAML::Value << p.mape.mape_pct();
      out << YAML::EndMap;
    }
  }
  out << YAML::EndSeq << YAML::EndMap;
  return std::string(out.c_str());
}

absl::Status TransferEstimator::Restore(std::string_view text) {
  SLICESCHED_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlString(ToAbsl(text), kTransferSource));
  ConfigErrors errors;
  ConfigReader r(root, kTransferSource, &errors);
  const ConfigReader list = estimate_internal::ReadStateRoot(r, "transfers", &errors);
  struct Staged {
    size_t index;
    double alpha, c;
    bool fitted;
    int64_t samples;
    double mape_pct;
  };
  std::vector<Staged> staged;
  absl::flat_hash_set<size_t> seen;
  const size_t n = names_.size();
  auto find_device = [&](const ConfigReader& e, absl::string_view key) -> int {
    const std::string name = e.Required<std::string>(key);
    if (!e.Has(key)) return -1;
    for (size_t i = 0; i < n; ++i) {
      if (names_[i] == name) return static_cast<int>(i);
    }
    e.Check(false, key, StrCat("unknown device '", name, "'"));
    return -1;
  };
  for (const ConfigReader& e : list.Elements()) {
    if (!e.IsMap()) {
      e.Error("expected a map");
      continue;
    }
    e.RejectUnknownKeys(
        {"src", "dst", "alpha_ns_per_byte", "c_ns", "fitted", "samples", "mape_pct"});
    const int src = find_device(e, "src");
    const int dst = find_device(e, "dst");
    Staged s{};
    s.alpha = e.Required<double>("alpha_ns_per_byte");
    e.Check(s.alpha >= 0, "alpha_ns_per_byte", StrCat("must be non-negative, got ", s.alpha));
    s.c = e.Required<double>("c_ns");
    e.Check(s.c >= 0, "c_ns", StrCat("must be non-negative, got ", s.c));
    s.fitted = e.Required<bool>("fitted");
    s.samples = e.Optional<int64_t>("samples", 0);
    e.Check(s.samples >= 0, "samples", StrCat("must be non-negative, got ", s.samples));
    s.mape_pct = e.Optional<double>("mape_pct", 0.0);
    e.Check(s.mape_pct >= 0, "mape_pct", StrCat("must be non-negative, got ", s.mape_pct));
    if (src < 0 || dst < 0) continue;
    if (src == dst) {
      e.Error(StrCat("src and dst are the same device '", names_[src], "'"));
      continue;
    }
    s.index = static_cast<size_t>(src) * n + static_cast<size_t>(dst);
    if (!seen.insert(s.index).second) {
      e.Error(StrCat("pair ", names_[src], " -> ", names_[dst], " appears twice"));
    }
    staged.push_back(s);
  }
  SLICESCHED_RETURN_IF_ERROR(errors.ToStatus());
  for (const Staged& s : staged) {
    Pair& p = pairs_[s.index];
    p.count = 0;  // the window is not saved
    p.next = 0;
    p.fitted = s.fitted;
    p.alpha = s.fitted ? s.alpha : p.prior_alpha;
    p.c = s.fitted ? s.c : p.prior_c;
    p.samples = s.samples;
    p.mape.n = s.samples;
    p.mape.sum_abs_pct = s.mape_pct * static_cast<double>(s.samples);
  }
  return absl::OkStatus();
}

}  // namespace slicesched
