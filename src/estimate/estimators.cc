#include "slicesched/estimate/estimators.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "estimators_internal.h"
#include "nnls.h"
#include "slicesched/common/config.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "yaml-cpp/yaml.h"

namespace slicesched {
namespace estimate_internal {

// Nanoseconds (double) to a Duration: rounded, 0 for non-positive or NaN,
// Infinite() beyond the int64 range.
Duration NanosToDuration(double ns) {
  if (!(ns > 0)) return Duration::Zero();
  if (ns >= 9.2e18) return Duration::Infinite();
  return Duration::Nanos(std::llround(ns));
}

// Measured times enter the fit as weights 1 / t^2; a 0 ns measurement would
// make that infinite, so times are floored at 1 ns.
double MeasuredNs(Duration d) { return std::max(1.0, static_cast<double>(d.nanos())); }

// Weighted, column-scaled NNLS shared by both estimators.
//
// Rows are samples (x_i, t_i). Minimising the squared relative error
//   sum_i ((x_i . beta - t_i) / t_i)^2
// is ordinary NNLS on rows a_i = x_i / t_i with right-hand side 1. The
// columns of that matrix differ by up to ~10 orders of magnitude (b*m*n*k
// against the constant), so each is scaled to unit norm, s_j = ||a_j||, and
// the solver works on gamma_j = s_j * beta_j (a positive scaling, so
// gamma >= 0 <=> beta >= 0). A column that is zero in every row carries no
// information: it is left out and its coefficient keeps the value in `beta`.
//
// `x` is row-major rows x n, `t` has `rows` entries; `a` is scratch.
// Returns false (beta untouched) when nothing could be fitted.
bool FitRelativeNnls(const double* x, const double* t, int rows, int n, std::vector<double>& a,
                     double* beta) {
  a.assign(static_cast<size_t>(rows) * n, 0.0);
  int cols[kMaxFeatures];
  double scale[kMaxFeatures];
  int nc = 0;
  for (int j = 0; j < n; ++j) {
    double* col = a.data() + static_cast<size_t>(nc) * rows;
    double sq = 0;
    for (int i = 0; i < rows; ++i) {
      col[i] = x[static_cast<size_t>(i) * n + j] / t[i];
      sq += col[i] * col[i];
    }
    const double norm = std::sqrt(sq);
    if (!(norm > 0) || !std::isfinite(norm)) continue;
    for (int i = 0; i < rows; ++i) col[i] /= norm;
    cols[nc] = j;
    scale[nc] = norm;
    ++nc;
  }
  if (nc == 0) return false;
  std::vector<double> ones(rows, 1.0);
  double gamma[kMaxFeatures] = {};
  SolveNnls(std::span<const double>(a.data(), static_cast<size_t>(rows) * nc), rows, nc, ones,
            std::span<double>(gamma, nc));
  for (int c = 0; c < nc; ++c) {
    if (!std::isfinite(gamma[c]) || gamma[c] < 0) return false;
  }
  for (int c = 0; c < nc; ++c) beta[cols[c]] = gamma[c] / scale[c];
  return true;
}

// Scales `beta` (n coefficients) so that the rows' predicted total equals
// their measured total. The relative fit above minimises the spread of
// measured / predicted but, with noise, settles below the mean measurement
// (for one repeated shape it predicts sum(1/t) / sum(1/t^2), under even the
// harmonic mean), so sums of predictions (an iteration's critical path) came
// out short. One scalar keeps the fitted shape of the model and every
// coefficient >= 0. Without noise the scalar is 1.
void MeanUnbias(const double* x, const double* t, int rows, int n, double* beta) {
  double measured = 0, predicted = 0;
  for (int i = 0; i < rows; ++i) {
    double p = 0;
    for (int j = 0; j < n; ++j) p += x[static_cast<size_t>(i) * n + j] * beta[j];
    measured += t[i];
    predicted += p;
  }
  const double k = measured / predicted;
  if (!(predicted > 0) || !(k > 0) || !std::isfinite(k)) return;
  for (int j = 0; j < n; ++j) beta[j] *= k;
}

// The root of a saved state: a map holding `version` and `list_key`.
ConfigReader ReadStateRoot(const ConfigReader& r, absl::string_view list_key,
                           ConfigErrors* errors) {
  if (!r.present() || !r.IsMap()) {
    errors->AddGlobal(
        StrCat(r.source().name, ": estimator state must be a map with 'version' and '", list_key, "'"));
    return r.Child(list_key);
  }
  r.RejectUnknownKeys({absl::string_view("version"), list_key});
  const int64_t version = r.Required<int64_t>("version");
  if (r.Has("version")) {
    r.Check(version == kStateVersion, "version",
            StrCat("unsupported version ", version, " (expected ", kStateVersion, ")"));
  }
  ConfigReader list = r.RequiredChild(list_key);
  if (list.present() && !list.IsList()) list.Error("expected a list");
  return list;
}

}  // namespace estimate_internal

namespace {

using estimate_internal::FitRelativeNnls;
using estimate_internal::kStateVersion;
using estimate_internal::MeanUnbias;
using estimate_internal::MeasuredNs;
using estimate_internal::NanosToDuration;
using estimate_internal::ReadStateRoot;

constexpr absl::string_view kOpSource = "<op estimator state>";

void EmitDoubles(YAML::Emitter& out, const double* v, int n) {
  out << YAML::Flow << YAML::BeginSeq;
  for (int i = 0; i < n; ++i) out << v[i];
  out << YAML::EndSeq;
}

// Reads a list of non-negative finite numbers under `key` (NaN entries mark
// values already reported as malformed).
std::vector<double> ReadNonNegativeList(const ConfigReader& entry, absl::string_view key,
                                        bool required) {
  std::vector<double> out;
  ConfigReader list = required ? entry.RequiredChild(key) : entry.Child(key);
  if (!list.present()) return out;
  if (!list.IsList()) {
    list.Error("expected a list of numbers");
    return out;
  }
  for (const ConfigReader& e : list.Elements()) {
    const double v = e.As<double>(std::numeric_limits<double>::quiet_NaN());
    if (std::isnan(v)) continue;  // reported by As()
    if (v < 0) e.Error(StrCat("coefficient must be non-negative, got ", v));
    out.push_back(v);
  }
  return out;
}

std::string JoinNames(const std::vector<std::string>& names) {
  std::string s = "[";
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return s + "]";
}

}  // namespace

// ---------------------------------------------------------------------------
// MapeCounter

void MapeCounter::Add(double predicted, double actual) {
  // The relative error is undefined for a non-positive actual.
  if (!(actual > 0) || !std::isfinite(predicted)) return;
  ++n;
  sum_abs_pct += std::abs(predicted - actual) / actual * 100.0;
}

// ---------------------------------------------------------------------------
// FeatureBasis

FeatureBasis FeatureBasis::For(const OpSpec& op) {
  auto find = [&op](std::string_view name) {
    for (size_t i = 0; i < op.attrs.size(); ++i) {
      if (op.attrs[i].first == name) return static_cast<int>(i);
    }
    return -1;
  };
  FeatureBasis fb;
  switch (op.kind) {
    case OpKind::kMatmul:
      fb.kind_ = Kind::kMatmul;
      fb.size_ = 5;
      fb.pos_ = {find("b"), find("m"), find("n"), find("k")};
      break;
    case OpKind::kFusedLayers:
    case OpKind::kTrainForward:
    case OpKind::kTrainBackward:
      fb.kind_ = Kind::kLayers;
      fb.size_ = 4;
      fb.pos_ = {find("batch"), find("new_tokens"), find("context"), -1};
      break;
    case OpKind::kEmbedding:
    case OpKind::kTrainLoss:
      fb.kind_ = Kind::kTokens;
      fb.size_ = 2;
      fb.pos_ = {find("batch"), find("new_tokens"), -1, -1};
      break;
    case OpKind::kLmHead:
    case OpKind::kSample:
      fb.kind_ = Kind::kBatch;
      fb.size_ = 2;
      fb.pos_ = {find("batch"), -1, -1, -1};
      break;
    default:
      break;  // constant
  }
  return fb;
}

Features FeatureBasis::Compute(std::span<const int64_t> attrs) const {
  // Attribute at slot `s`, or `missing` when the op does not declare it (or
  // the caller passed fewer values).
  auto at = [&](int s, double missing) {
    const int p = pos_[s];
    return p >= 0 && static_cast<size_t>(p) < attrs.size() ? static_cast<double>(attrs[p])
                                                           : missing;
  };
  Features f;
  f.n = size_;
  switch (kind_) {
    case Kind::kMatmul: {
      const double b = at(0, 1), m = at(1, 1), n = at(2, 1), k = at(3, 1);
      // FLOPs, the two operands and the result (paper Eq 2), launch.
      f.v = {b * m * n * k, b * m * k, b * k * n, b * m * n, 1, 0};
      break;
    }
    case Kind::kLayers: {
      const double batch = at(0, 1), s = at(1, 1), c = at(2, 0);
      // GEMM FLOPs ~ tokens, attention ~ tokens x span, KV read ~ span.
      f.v = {batch * s, batch * s * (c + s), batch * (c + s), 1, 0, 0};
      break;
    }
    case Kind::kTokens:
      f.v = {at(0, 1) * at(1, 1), 1, 0, 0, 0, 0};
      break;
    case Kind::kBatch:
      f.v = {at(0, 1), 1, 0, 0, 0, 0};
      break;
    case Kind::kConstant:
      f.v = {1, 0, 0, 0, 0, 0};
      break;
  }
  return f;
}

std::vector<std::string> FeatureBasis::names() const {
  switch (kind_) {
    case Kind::kMatmul:
      return {"b*m*n*k", "b*m*k", "b*k*n", "b*m*n", "1"};
    case Kind::kLayers:
      return {"B*S", "B*S*(C+S)", "B*(C+S)", "1"};
    case Kind::kTokens:
      return {"B*S", "1"};
    case Kind::kBatch:
      return {"B", "1"};
    case Kind::kConstant:
      break;
  }
  return {"1"};
}

// ---------------------------------------------------------------------------
// OpEstimator

struct OpEstimator::Key {
  std::string device_type, template_name, op_name;
  FeatureBasis basis;
  std::vector<std::string> feature_names;
  // Coefficients in use: the fit, else the prior, else [0, ..., default].
  std::array<double, kMaxFeatures> coeffs{};
  std::array<double, kMaxFeatures> prior{};
  bool has_prior = false;
  bool fitted = false;
  // Ring buffer of the most recent samples: features row-major
  // (capacity x kMaxFeatures) and measured nanoseconds. Allocated on the
  // first observation.
  std::vector<double> x;
  std::vector<double> t;
  int next = 0;   // slot the next sample is written to
  int count = 0;  // samples held
  int64_t samples = 0;
  MapeCounter mape;
};

OpEstimator::OpEstimator(OpEstimatorOptions options) : options_(options) {
  options_.window = std::max(options_.window, kMaxFeatures);
  if (options_.default_duration < Duration::Zero()) options_.default_duration = Duration::Zero();
}
OpEstimator::~OpEstimator() = default;
OpEstimator::OpEstimator(OpEstimator&&) noexcept = default;
OpEstimator& OpEstimator::operator=(OpEstimator&&) noexcept = default;

int OpEstimator::num_keys() const { return static_cast<int>(keys_.size()); }

void OpEstimator::ResetCoeffs(Key& key) const {
  if (key.has_prior) {
    key.coeffs = key.prior;
    return;
  }
  // Every basis ends with the constant feature: the default duration is the
  // prediction [0, ..., 0, default] . features.
  key.coeffs.fill(0);
  key.coeffs[key.basis.size() - 1] = static_cast<double>(options_.default_duration.nanos());
}

int OpEstimator::Register(std::string_view device_type, const GraphTemplate& tpl, int op) {
  if (op < 0 || op >= tpl.num_ops()) return -1;
  const OpSpec& spec = tpl.op(op);
  const FeatureBasis basis = FeatureBasis::For(spec);
  std::string template_name = tpl.name(), op_name = spec.name;
  if (const size_t bar = spec.cost_of.find('|'); bar != std::string::npos) {
    const std::string shared = StrCat(device_type, "|", spec.cost_of);
    auto it = by_name_.find(shared);
    if (it == by_name_.end() || keys_[it->second].basis == basis) {
      if (it != by_name_.end()) return it->second;
      template_name = spec.cost_of.substr(0, bar);
      op_name = spec.cost_of.substr(bar + 1);
    }
  }
  std::string name = StrCat(device_type, "|", template_name, "|", op_name);
  if (auto it = by_name_.find(name); it != by_name_.end()) {
    if (keys_[it->second].basis == basis) return it->second;
    // The key was made by an op naming this one in cost_of, with attributes
    // this op lays out otherwise: this op keeps a model of its own.
    op_name = StrCat(op_name, "|own");
    name = StrCat(name, "|own");
    if (auto own = by_name_.find(name); own != by_name_.end()) return own->second;
  }
  Key key;
  key.device_type = std::string(device_type);
  key.template_name = std::move(template_name);
  key.op_name = std::move(op_name);
  key.basis = basis;
  key.feature_names = key.basis.names();
  ResetCoeffs(key);
  if (auto it = pending_.find(name); it != pending_.end()) {
    // A basis that changed since the state was saved (template edited)
    // cannot use the old coefficients; the key starts cold instead.
    if (it->second.feature_names == key.feature_names) Apply(it->second, key);
    pending_.erase(it);
  }
  const int id = static_cast<int>(keys_.size());
  keys_.push_back(std::move(key));
  by_name_.emplace(std::move(name), id);
  return id;
}

// The simulator calls this once per node it builds: `flatten` inlines
// FeatureBasis::Dot, which sums the products as they are formed (same
// arithmetic, same order as Compute + dot) instead of filling a Features.
[[gnu::flatten]] double OpEstimator::PredictNs(int key, std::span<const int64_t> attrs) const {
  if (key < 0 || static_cast<size_t>(key) >= keys_.size()) {
    return static_cast<double>(options_.default_duration.nanos());
  }
  const Key& k = keys_[key];
  const double t = k.basis.Dot(k.coeffs.data(), attrs);
  return t > 0 ? t : 0.0;  // coefficients are >= 0; guards negative attrs and NaN
}

bool OpEstimator::LinearModel(int key, const FeatureBasis** basis, const double** coeffs) const {
  if (key < 0 || static_cast<size_t>(key) >= keys_.size()) return false;
  *basis = &keys_[key].basis;
  *coeffs = keys_[key].coeffs.data();
  return true;
}

bool OpEstimator::HasModel(int key) const {
  if (key < 0 || static_cast<size_t>(key) >= keys_.size()) return false;
  return keys_[key].fitted || keys_[key].has_prior;
}

Duration OpEstimator::Predict(int key, std::span<const int64_t> attrs) const {
  return NanosToDuration(PredictNs(key, attrs));
}

void OpEstimator::Observe(int key, std::span<const int64_t> attrs, Duration measured) {
  if (key < 0 || static_cast<size_t>(key) >= keys_.size()) return;
  Key& k = keys_[key];
  const double t = MeasuredNs(measured);
  // Honest online error: the prediction made before this sample is known.
  k.mape.Add(PredictNs(key, attrs), t);
  ++k.samples;
  const size_t cap = static_cast<size_t>(options_.window);
  if (k.t.empty()) {
    k.x.resize(cap * kMaxFeatures);
    k.t.resize(cap);
  }
  const Features f = k.basis.Compute(attrs);
  std::copy(f.v.begin(), f.v.end(), k.x.begin() + static_cast<size_t>(k.next) * kMaxFeatures);
  k.t[k.next] = t;
  k.next = (k.next + 1) % options_.window;
  k.count = std::min(k.count + 1, options_.window);
  Refit(k);
}

void OpEstimator::Refit(Key& k) {
  const int n = k.basis.size();
  if (k.count < n) return;  // under-determined: keep prior / restored / default
  // Window rows in ring order (the fit does not depend on order); compact the
  // kMaxFeatures-wide rows to n columns.
  std::vector<double> x(static_cast<size_t>(k.count) * n);
  for (int i = 0; i < k.count; ++i) {
    for (int j = 0; j < n; ++j) x[static_cast<size_t>(i) * n + j] = k.x[static_cast<size_t>(i) * kMaxFeatures + j];
  }
  std::vector<double> scratch;
  double beta[kMaxFeatures];
  std::copy(k.coeffs.begin(), k.coeffs.end(), beta);
  if (!FitRelativeNnls(x.data(), k.t.data(), k.count, n, scratch, beta)) return;
  MeanUnbias(x.data(), k.t.data(), k.count, n, beta);
  std::copy(beta, beta + n, k.coeffs.begin());
  k.fitted = true;
}

absl::Status OpEstimator::SetPrior(int key, std::span<const double> coeffs) {
  if (key < 0 || static_cast<size_t>(key) >= keys_.size()) {
    return absl::InvalidArgumentError(StrCat("SetPrior: no estimator key ", key));
  }
  Key& k = keys_[key];
  const std::string where = StrCat(k.device_type, "|", k.template_name, "|", k.op_name);
  if (coeffs.size() != static_cast<size_t>(k.basis.size())) {
    return absl::InvalidArgumentError(StrCat("SetPrior for '", where, "': expected ",
                                             k.basis.size(), " coefficients ",
                                             JoinNames(k.feature_names), ", got ", coeffs.size()));
  }
  for (size_t j = 0; j < coeffs.size(); ++j) {
    if (!std::isfinite(coeffs[j]) || coeffs[j] < 0) {
      return absl::InvalidArgumentError(StrCat("SetPrior for '", where, "': coefficient ", j, " (",
                                               k.feature_names[j],
                                               ") must be finite and non-negative, got ",
                                               coeffs[j]));
    }
  }
  k.prior.fill(0);
  std::copy(coeffs.begin(), coeffs.end(), k.prior.begin());
  k.has_prior = true;
  if (!k.fitted) k.coeffs = k.prior;
  return absl::OkStatus();
}

std::vector<OpEstimator::KeyStats> OpEstimator::Stats() const {
  std::vector<KeyStats> out;
  out.reserve(keys_.size());
  for (const Key& k : keys_) {
    KeyStats s;
    s.device_type = k.device_type;
    s.template_name = k.template_name;
    s.op_name = k.op_name;
    s.feature_names = k.feature_names;
    s.coeffs.assign(k.coeffs.begin(), k.coeffs.begin() + k.basis.size());
    s.samples = k.samples;
    s.mape_pct = k.mape.mape_pct();
    s.fitted = k.fitted;
    out.push_back(std::move(s));
  }
  return out;
}

std::string OpEstimator::Save() const {
  YAML::Emitter out;
  out.SetDoublePrecision(std::numeric_limits<double>::max_digits10);  // exact round trip
  out << YAML::BeginMap << YAML::Key << "version" << YAML::Value << kStateVersion;
  out << YAML::Key << "ops" << YAML::Value << YAML::BeginSeq;
  auto emit = [&out](const std::string& device_type, const std::string& template_name,
                     const std::string& op_name, const std::vector<std::string>& features,
                     const double* coeffs, const double* prior, bool fitted, int64_t samples,
                     double mape_pct) {
    const int n = static_cast<int>(features.size());
    out << YAML::BeginMap;
    out << YAML::Key << "device_type" << YAML::Value << device_type;
    out << YAML::Key << "template" << YAML::Value << template_name;
    out << YAML::Key << "op" << YAML::Value << op_name;
    out << YAML::Key << "features" << YAML::Value << YAML::Flow << features;
    out << YAML::Key << "coeffs" << YAML::Value;
    EmitDoubles(out, coeffs, n);
    if (prior != nullptr) {
      out << YAML::Key << "prior" << YAML::Value;
      EmitDoubles(out, prior, n);
    }
    out << YAML::Key << "fitted" << YAML::Value << fitted;
    out << YAML::Key << "samples" << YAML::Value << samples;
    out << YAML::Key << "mape_pct" << YAML::Value << mape_pct;
    out << YAML::EndMap;
  };
  for (const Key& k : keys_) {
    emit(k.device_type, k.template_name, k.op_name, k.feature_names, k.coeffs.data(),
         k.has_prior ? k.prior.data() : nullptr, k.fitted, k.samples, k.mape.mape_pct());
  }
  // Restored keys not registered yet, sorted for a deterministic text.
  std::vector<const Restored*> pending;
  for (const auto& [name, r] : pending_) pending.push_back(&r);
  std::sort(pending.begin(), pending.end(), [](const Restored* a, const Restored* b) {
    return std::tie(a->device_type, a->template_name, a->op_name) <
           std::tie(b->device_type, b->template_name, b->op_name);
  });
  for (const Restored* r : pending) {
    emit(r->device_type, r->template_name, r->op_name, r->feature_names, r->coeffs.data(),
         r->prior.empty() ? nullptr : r->prior.data(), r->fitted, r->samples, r->mape_pct);
  }
  out << YAML::EndSeq << YAML::EndMap;
  return std::string(out.c_str());
}

void OpEstimator::Apply(const Restored& r, Key& key) const {
  // The window is not saved: the restored coefficients stand until the key
  // has collected enough new samples to refit.
  key.count = 0;
  key.next = 0;
  if (!r.prior.empty()) {
    key.prior.fill(0);
    std::copy(r.prior.begin(), r.prior.end(), key.prior.begin());
    key.has_prior = true;
  }
  key.fitted = r.fitted;
  if (r.fitted) {
    key.coeffs.fill(0);
    std::copy(r.coeffs.begin(), r.coeffs.end(), key.coeffs.begin());
  } else {
    ResetCoeffs(key);
  }
  key.samples = r.samples;
  key.mape.n = r.samples;
  key.mape.sum_abs_pct = r.mape_pct * static_cast<double>(r.samples);
}

absl::Status OpEstimator::Restore(std::string_view text) {
  SLICESCHED_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlString(ToAbsl(text), kOpSource));
  ConfigErrors errors;
  ConfigReader r(root, kOpSource, &errors);
  const ConfigReader list = ReadStateRoot(r, "ops", &errors);
  std::vector<std::pair<std::string, Restored>> staged;
  absl::flat_hash_set<std::string> seen;
  for (const ConfigReader& e : list.Elements()) {
    if (!e.IsMap()) {
      e.Error("expected a map");
      continue;
    }
    e.RejectUnknownKeys({"device_type", "template", "op", "features", "coeffs", "prior", "fitted",
                         "samples", "mape_pct"});
    Restored s;
    s.device_type = e.Required<std::string>("device_type");
    s.template_name = e.Required<std::string>("template");
    s.op_name = e.Required<std::string>("op");
    const ConfigReader features = e.RequiredChild("features");
    if (features.present() && !features.IsList()) {
      features.Error("expected a list of feature names");
    } else {
      for (const ConfigReader& f : features.Elements()) s.feature_names.push_back(f.As<std::string>());
    }
    s.coeffs = ReadNonNegativeList(e, "coeffs", /*required=*/true);
    s.prior = ReadNonNegativeList(e, "prior", /*required=*/false);
    s.fitted = e.Required<bool>("fitted");
    s.samples = e.Optional<int64_t>("samples", 0);
    e.Check(s.samples >= 0, "samples", StrCat("must be non-negative, got ", s.samples));
    s.mape_pct = e.Optional<double>("mape_pct", 0.0);
    e.Check(s.mape_pct >= 0, "mape_pct", StrCat("must be non-negative, got ", s.mape_pct));
    const size_t n = s.feature_names.size();
    if (features.present() && (n < 1 || n > static_cast<size_t>(kMaxFeatures))) {
      e.Check(false, "features", StrCat("expected 1 to ", kMaxFeatures, " features, got ", n));
    }
    if (e.Has("coeffs") && e.Child("coeffs").IsList() && e.Child("coeffs").size() != n) {
      e.Check(false, "coeffs",
              StrCat("expected ", n, " coefficients (one per feature), got ",
                     e.Child("coeffs").size()));
    }
    if (e.Has("prior") && e.Child("prior").IsList() && e.Child("prior").size() != n) {
      e.Check(false, "prior",
              StrCat("expected ", n, " coefficients (one per feature), got ",
                     e.Child("prior").size()));
    }
    std::string name = StrCat(s.device_type, "|", s.template_name, "|", s.op_name);
    if (!seen.insert(name).second) {
      e.Error(StrCat("key '", name, "' appears twice"));
    }
    if (auto it = by_name_.find(name); it != by_name_.end()) {
      const Key& k = keys_[it->second];
      if (k.feature_names != s.feature_names) {
        e.Check(false, "features",
                StrCat("key '", name, "' was saved with features ", JoinNames(s.feature_names),
                       " but is registered with ", JoinNames(k.feature_names)));
      }
    }
    staged.emplace_back(std::move(name), std::move(s));
  }
  // All or nothing: nothing changes unless the whole text is valid.
  SLICESCHED_RETURN_IF_ERROR(errors.ToStatus());
  for (auto& [name, s] : staged) {
    if (auto it = by_name_.find(name); it != by_name_.end()) {
      Apply(s, keys_[it->second]);
    } else {
      pending_[name] = std::move(s);
    }
  }
  return absl::OkStatus();
}

}  // namespace slicesched
