#include "slicesched/estimate/estimators.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "nnls.h"
#include "slicesched/common/config.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "yaml-cpp/yaml.h"

namespace slicesched {
namespace {

using estimate_internal::SolveNnls;

constexpr int kStateVersion = 1;
constexpr absl::string_view kOpSource = "<op estimator state>";
constexpr absl::string_view kTransferSource = "<transfer estimator state>";

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

// ---------------------------------------------------------------------------
// TransferEstimator

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
  return NanosToDuration(PredictNs(src, dst, size.count()));
}

void TransferEstimator::Observe(DeviceId src, DeviceId dst, Bytes size, Duration measured) {
  const size_t n = names_.size();
  if (src == dst || !src.valid() || !dst.valid() || src.value() >= n || dst.value() >= n) return;
  Pair& p = pairs_[src.value() * n + dst.value()];
  const double t = MeasuredNs(measured);
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
  if (!FitRelativeNnls(x.data(), p.t.data(), p.count, 2, scratch, beta)) return;
  MeanUnbias(x.data(), p.t.data(), p.count, 2, beta);
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
  out << YAML::BeginMap << YAML::Key << "version" << YAML::Value << kStateVersion;
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
  const ConfigReader list = ReadStateRoot(r, "transfers", &errors);
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
