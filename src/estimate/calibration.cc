#include "slicesched/estimate/calibration.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "slicesched/common/config.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "yaml-cpp/yaml.h"

namespace slicesched {
namespace {

constexpr int kCalibrationStateVersion = 1;
constexpr absl::string_view kCalibrationSource = "<calibration state>";

}  // namespace

RuntimeCalibration::RuntimeCalibration(size_t devices, double smoothing)
    : RuntimeCalibration(std::vector<int>(devices, 0), smoothing) {}

RuntimeCalibration::RuntimeCalibration(const AcceleratorSet& accelerators, double smoothing)
    : smoothing_(smoothing) {
  std::vector<std::string> types;
  for (const DeviceSpec& d : accelerators.devices()) {
    auto it = std::find(types.begin(), types.end(), d.type);
    groups_.push_back(static_cast<int>(it - types.begin()));
    names_.push_back(d.name);
    if (it == types.end()) types.push_back(d.type);
  }
  InitDevices();
}

RuntimeCalibration::RuntimeCalibration(std::vector<int> device_groups, double smoothing)
    : smoothing_(smoothing), groups_(std::move(device_groups)) {
  InitDevices();
}

void RuntimeCalibration::InitDevices() {
  raw_.resize(groups_.size());
  device_.assign(groups_.size(), 1.0);
  others_since_.assign(groups_.size(), 0);
  // A dense index per distinct group, for its drift.
  std::vector<int> seen;
  for (int g : groups_) {
    auto it = std::find(seen.begin(), seen.end(), g);
    group_index_.push_back(static_cast<int>(it - seen.begin()));
    if (it == seen.end()) seen.push_back(g);
  }
  drift_.assign(seen.size(), Ratio{});
}

bool RuntimeCalibration::Ratio::Step(double model_ns, double measured_ns, double smoothing) {
  // Nonsense samples (and a model more than 10x off: a cold key) are
  // ignored, so a burst of them cannot run away with the factor.
  const double ratio = measured_ns / model_ns;
  if (!(model_ns > 0.0) || !(ratio > 0.0) || ratio > 10.0) return false;
  measured += smoothing * (measured_ns - measured);
  model += smoothing * (model_ns - model);
  weight += smoothing * (1.0 - weight);
  ++samples;
  Refresh();
  return true;
}

void RuntimeCalibration::Ratio::Refresh() {
  const double learned = weight > 0 && model > 0 ? (1.0 - weight) * prior + weight * (measured / model) : prior;
  factor = std::clamp(learned, 0.25, 4.0);
}

void RuntimeCalibration::PinGroup(int group) {
  // Geometric mean of the group's raw factors -> 1.
  double log_sum = 0;
  int n = 0;
  for (size_t d = 0; d < groups_.size(); ++d) {
    if (groups_[d] != group) continue;
    log_sum += std::log(raw_[d].factor);
    ++n;
  }
  if (n == 0) return;
  const double mean = std::exp(log_sum / n);
  for (size_t d = 0; d < groups_.size(); ++d) {
    if (groups_[d] == group) device_[d] = std::clamp(raw_[d].factor / mean, 0.25, 4.0);
  }
}

double RuntimeCalibration::GroupPrior(size_t device) const {
  double log_sum = 0;
  int n = 0;
  for (size_t e = 0; e < groups_.size(); ++e) {
    if (e == device || groups_[e] != groups_[device] || !(raw_[e].weight > 0)) continue;
    log_sum += std::log(raw_[e].factor);
    ++n;
  }
  return n == 0 ? 1.0 : std::exp(log_sum / n);
}

void RuntimeCalibration::AgeOthers(size_t d) {
  others_since_[d] = 0;
  if (ageing_.half_life_samples == CalibrationAgeing::kNever) return;
  // Each sample past the grace scales the evidence by the same factor, so
  // the weight halves every half_life_samples.
  const double keep = std::exp2(-1.0 / static_cast<double>(std::max<int64_t>(1, ageing_.half_life_samples)));
  for (size_t e = 0; e < groups_.size(); ++e) {
    if (e == d || groups_[e] != groups_[d]) continue;
    if (++others_since_[e] <= ageing_.grace_samples) continue;
    Ratio& r = raw_[e];
    if (!(r.weight > 0)) continue;
    r.measured *= keep;
    r.model *= keep;
    r.weight *= keep;
    r.prior = GroupPrior(e);
    r.Refresh();
  }
}

void RuntimeCalibration::ObserveOp(DeviceId d, double model_ns, double measured_ns, bool overlapped) {
  if (!(model_ns > 0.0) || d.value() >= device_.size()) return;
  if (overlapped) {
    // Relative to the drifted speed (the header).
    overlap_.Step(model_ns * device_factor(d), measured_ns, smoothing_);
  } else if (raw_[d.value()].Step(model_ns, measured_ns, smoothing_)) {
    AgeOthers(d.value());
    PinGroup(groups_[d.value()]);
  }
}

void RuntimeCalibration::ObserveSpeed(DeviceId d, double model_ns, double measured_ns) {
  if (!(drift_smoothing_ > 0.0) || !(model_ns > 0.0) || d.value() >= device_.size()) return;
  drift_[group_index_[d.value()]].Step(model_ns * device_[d.value()], measured_ns, drift_smoothing_);
}

void RuntimeCalibration::ObserveTransfer(double model_ns, double measured_ns, bool overlapped) {
  if (!overlapped || !(model_ns > 0.0)) return;
  transfer_overlap_.Step(model_ns, measured_ns, smoothing_);
}

CalibrationView RuntimeCalibration::View() const {
  CalibrationView v;
  v.device_groups = groups_;
  for (size_t d = 0; d < groups_.size(); ++d) {
    v.devices.push_back(
        {.factor = device_[d], .raw = raw_[d].factor, .weight = raw_[d].weight, .samples = raw_[d].samples});
  }
  auto view = [](const Ratio& r) {
    return CalibrationFactorView{.factor = r.factor, .raw = r.factor, .weight = r.weight, .samples = r.samples};
  };
  for (size_t d = 0; d < groups_.size(); ++d) v.drift.push_back(view(drift_[group_index_[d]]));
  v.overlap = view(overlap_);
  v.transfer_overlap = view(transfer_overlap_);
  return v;
}

namespace {

template <typename Ratio>
void EmitRatio(YAML::Emitter& out, const Ratio& r) {
  out << YAML::Key << "measured_ns" << YAML::Value << r.measured;
  out << YAML::Key << "model_ns" << YAML::Value << r.model;
  out << YAML::Key << "weight" << YAML::Value << r.weight;
  out << YAML::Key << "prior" << YAML::Value << r.prior;
  out << YAML::Key << "samples" << YAML::Value << r.samples;
}

}  // namespace

std::string RuntimeCalibration::Save() const {
  YAML::Emitter out;
  out.SetDoublePrecision(std::numeric_limits<double>::max_digits10);  // exact round trip
  out << YAML::BeginMap << YAML::Key << "version" << YAML::Value << kCalibrationStateVersion;
  out << YAML::Key << "devices" << YAML::Value << YAML::BeginSeq;
  for (size_t d = 0; d < groups_.size(); ++d) {
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "id" << YAML::Value << d;
    if (!names_.empty()) out << YAML::Key << "name" << YAML::Value << names_[d];
    out << YAML::Key << "group" << YAML::Value << groups_[d];
    EmitRatio(out, raw_[d]);
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
  for (const auto& [key, r] : {std::pair<const char*, const Ratio*>{"overlap", &overlap_},
                               std::pair<const char*, const Ratio*>{"transfer_overlap", &transfer_overlap_}}) {
    out << YAML::Key << key << YAML::Value << YAML::Flow << YAML::BeginMap;
    EmitRatio(out, *r);
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str());
}

namespace {

// Reads one saved Ratio's fields into `r`, checking their ranges.
template <typename Ratio>
void ReadRatio(const ConfigReader& e, Ratio* r) {
  r->measured = e.Required<double>("measured_ns");
  r->model = e.Required<double>("model_ns");
  r->weight = e.Required<double>("weight");
  r->prior = e.Required<double>("prior");
  r->samples = e.Required<int64_t>("samples");
  e.Check(std::isfinite(r->measured) && r->measured >= 0, "measured_ns",
          StrCat("must be a non-negative number, got ", r->measured));
  e.Check(std::isfinite(r->model) && r->model >= 0, "model_ns",
          StrCat("must be a non-negative number, got ", r->model));
  e.Check(r->weight >= 0 && r->weight <= 1, "weight", StrCat("must be in [0, 1], got ", r->weight));
  e.Check(r->prior >= 0.25 && r->prior <= 4, "prior", StrCat("must be in [0.25, 4], got ", r->prior));
  e.Check(r->samples >= 0, "samples", StrCat("must be non-negative, got ", r->samples));
  if (r->weight > 0) e.Check(r->model > 0, "model_ns", "must be positive when weight is");
  r->Refresh();
}

}  // namespace

absl::Status RuntimeCalibration::Restore(std::string_view text) {
  SLICESCHED_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlString(ToAbsl(text), kCalibrationSource));
  ConfigErrors errors;
  ConfigReader r(root, kCalibrationSource, &errors);
  if (!r.present() || !r.IsMap()) {
    return absl::InvalidArgumentError(
        StrCat(kCalibrationSource, ": must be a map with 'version', 'devices', 'overlap', 'transfer_overlap'"));
  }
  r.RejectUnknownKeys({"version", "devices", "overlap", "transfer_overlap"});
  const int64_t version = r.Required<int64_t>("version");
  if (r.Has("version")) {
    r.Check(version == kCalibrationStateVersion, "version",
            StrCat("unsupported version ", version, " (expected ", kCalibrationStateVersion, ")"));
  }
  std::vector<Ratio> raw(groups_.size());
  const ConfigReader list = r.RequiredChild("devices");
  if (list.present() && !list.IsList()) {
    list.Error("expected a list");
  } else if (list.present() && list.size() != groups_.size()) {
    list.Error(StrCat("saved for ", list.size(), " devices, but this daemon has ", groups_.size()));
  } else if (list.present()) {
    for (size_t d = 0; d < groups_.size(); ++d) {
      const ConfigReader e = list.At(d);
      if (!e.IsMap()) {
        e.Error("expected a map");
        continue;
      }
      e.RejectUnknownKeys({"id", "name", "group", "measured_ns", "model_ns", "weight", "prior", "samples"});
      const int64_t id = e.Required<int64_t>("id");
      e.Check(!e.Has("id") || id == static_cast<int64_t>(d), "id", StrCat("expected ", d, ", got ", id));
      const int64_t group = e.Required<int64_t>("group");
      e.Check(!e.Has("group") || group == groups_[d], "group",
              StrCat("device ", d, " was saved in device group ", group, " but is in group ", groups_[d],
                     " now (its device type changed)"));
      if (e.Has("name") && !names_.empty()) {
        const std::string name = e.Required<std::string>("name");
        e.Check(name == names_[d], "name",
                StrCat("device ", d, " was saved as '", name, "' but is '", names_[d], "' now"));
      }
      ReadRatio(e, &raw[d]);
    }
  }
  Ratio overlap, transfer_overlap;
  for (const auto& [key, out] : {std::pair<const char*, Ratio*>{"overlap", &overlap},
                                 std::pair<const char*, Ratio*>{"transfer_overlap", &transfer_overlap}}) {
    const ConfigReader e = r.RequiredChild(key);
    if (!e.present()) continue;
    if (!e.IsMap()) {
      e.Error("expected a map");
      continue;
    }
    e.RejectUnknownKeys({"measured_ns", "model_ns", "weight", "prior", "samples"});
    ReadRatio(e, out);
  }
  SLICESCHED_RETURN_IF_ERROR(errors.ToStatus());
  raw_ = std::move(raw);
  overlap_ = overlap;
  transfer_overlap_ = transfer_overlap;
  std::fill(drift_.begin(), drift_.end(), Ratio{});  // not saved: starts at 1 (the header)
  std::fill(others_since_.begin(), others_since_.end(), 0);
  for (int g : groups_) PinGroup(g);
  return absl::OkStatus();
}

}  // namespace slicesched
