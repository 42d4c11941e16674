#include "slicesched/gmg/accelerator.h"

#include <cmath>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "slicesched/common/strings.h"

namespace slicesched {

absl::string_view DeviceBackendName(DeviceBackend b) {
  switch (b) {
    case DeviceBackend::kCpu: return "cpu";
    case DeviceBackend::kCuda: return "cuda";
    case DeviceBackend::kEmulated: return "emulated";
    case DeviceBackend::kVirtual: return "virtual";
  }
  return "?";
}

absl::StatusOr<DeviceBackend> ParseDeviceBackend(absl::string_view name) {
  for (DeviceBackend b : {DeviceBackend::kCpu, DeviceBackend::kCuda, DeviceBackend::kEmulated,
                          DeviceBackend::kVirtual}) {
    if (DeviceBackendName(b) == name) return b;
  }
  return absl::InvalidArgumentError(
      StrCat("unknown backend '", name, "' (expected cpu, cuda, emulated or virtual)"));
}

absl::StatusOr<double> ParseBandwidth(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  if (!absl::ConsumeSuffix(&t, "/s")) {
    // A plain number of bytes per second.
    double v = 0;
    if (!absl::SimpleAtod(t, &v) || !(v > 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(
          StrCat("expected a bandwidth such as 12GB/s, got '", text, "'"));
    }
    return v;
  }
  auto bytes = Bytes::Parse(absl::StripAsciiWhitespace(t));
  if (!bytes.ok() || bytes->count() <= 0) {
    return absl::InvalidArgumentError(
        StrCat("expected a bandwidth such as 12GB/s, got '", text, "'"));
  }
  return static_cast<double>(bytes->count());
}

absl::StatusOr<AcceleratorSet> AcceleratorSet::Create(std::vector<DeviceSpec> devices,
                                                      LinkSpec default_link) {
  if (devices.empty()) return absl::InvalidArgumentError("the accelerator set has no devices");
  if (devices.size() >= 0xffff) return absl::InvalidArgumentError("too many devices");
  if (!(default_link.bandwidth_bytes_per_s > 0)) {
    return absl::InvalidArgumentError("default link bandwidth must be positive");
  }
  if (default_link.latency < Duration::Zero()) {
    return absl::InvalidArgumentError("default link latency must not be negative");
  }
  absl::flat_hash_set<std::string> names;
  for (size_t i = 0; i < devices.size(); ++i) {
    DeviceSpec& d = devices[i];
    d.id = DeviceId(static_cast<uint16_t>(i));
    if (d.name.empty()) return absl::InvalidArgumentError(StrCat("device #", i, " has no name"));
    if (!names.insert(d.name).second) {
      return absl::InvalidArgumentError(StrCat("duplicate device name '", d.name, "'"));
    }
    if (d.type.empty()) return absl::InvalidArgumentError(StrCat("device '", d.name, "' has no type"));
    if (d.memory <= Bytes(0)) {
      return absl::InvalidArgumentError(StrCat("device '", d.name, "' has no memory capacity"));
    }
  }
  AcceleratorSet set;
  set.devices_ = std::move(devices);
  set.links_.assign(set.devices_.size() * set.devices_.size(), default_link);
  return set;
}

absl::StatusOr<DeviceId> AcceleratorSet::FindDevice(absl::string_view name) const {
  for (const DeviceSpec& d : devices_) {
    if (d.name == name) return d.id;
  }
  return absl::NotFoundError(StrCat("no device named '", name, "'"));
}

absl::Status AcceleratorSet::SetLink(DeviceId a, DeviceId b, LinkSpec link) {
  if (!a.valid() || !b.valid() || a.value() >= size() || b.value() >= size()) {
    return absl::InvalidArgumentError("link endpoint out of range");
  }
  if (a == b) return absl::InvalidArgumentError("a link needs two distinct devices");
  if (!(link.bandwidth_bytes_per_s > 0)) return absl::InvalidArgumentError("link bandwidth must be positive");
  if (link.latency < Duration::Zero()) return absl::InvalidArgumentError("link latency must not be negative");
  links_[a.value() * size() + b.value()] = link;
  links_[b.value() * size() + a.value()] = link;
  return absl::OkStatus();
}

namespace {

LinkSpec ReadLink(const ConfigReader& r, LinkSpec defaults) {
  LinkSpec link = defaults;
  if (!r.present()) return link;
  if (r.Has("bandwidth")) {
    std::string bw = r.Required<std::string>("bandwidth");
    auto parsed = ParseBandwidth(bw);
    r.Check(parsed.ok(), "bandwidth", parsed.ok() ? "" : parsed.status().message());
    if (parsed.ok()) link.bandwidth_bytes_per_s = *parsed;
  }
  link.latency = r.OptionalDuration("latency", defaults.latency);
  r.Check(link.latency >= Duration::Zero(), "latency", "must not be negative");
  return link;
}

// The CUDA device index of each of a config entry's `n` devices: `device: 0`
// (counting up from it), or one index per device (`device: [0, 0]` puts two
// logical devices on one GPU); `ordinal` is its older name. Without either,
// 0 upward. Only a cuda device may name one.
std::vector<int64_t> ReadCudaIndices(const ConfigReader& d, int64_t n, const DeviceBackend* backend,
                                     const std::string& backend_name) {
  const char* key = d.Has("device") ? "device" : "ordinal";
  d.Check(!(d.Has("device") && d.Has("ordinal")), "ordinal", "is the older name of 'device': give one of them");
  if (d.Has(key)) {
    d.Check(backend == nullptr || *backend == DeviceBackend::kCuda, key,
            StrCat("is the CUDA device index, only for backend cuda (this device's backend is '", backend_name, "')"));
  }
  std::vector<int64_t> indices;
  const ConfigReader dev = d.Child(key);
  if (dev.present() && dev.IsList()) {
    for (size_t k = 0; k < dev.size(); ++k) indices.push_back(dev.At(k).As<int64_t>(-1));
    dev.Check(static_cast<int64_t>(indices.size()) == n, "",
              StrCat("lists ", indices.size(), " CUDA device indices for ", n, " devices: give one per device"));
  }
  if (static_cast<int64_t>(indices.size()) != n) {
    indices.clear();
    const int64_t first = dev.present() && dev.IsList() ? 0 : d.Optional<int64_t>(key, 0);
    for (int64_t k = 0; k < n && k <= 4096; ++k) indices.push_back(first + k);
  }
  for (int64_t i : indices) d.Check(i >= 0 && i < 1024, key, StrCat("must be a CUDA device index from 0, got ", i));
  return indices;
}

}  // namespace

AcceleratorSet AcceleratorSet::FromConfig(const ConfigReader& cluster, ConfigErrors* errors) {
  std::vector<DeviceSpec> devices;
  std::vector<ConfigReader> device_readers;  // per expanded device, for errors
  // A misspelt `links` would otherwise leave every pair on the built-in prior.
  cluster.RejectUnknownKeys({"devices", "links"});
  ConfigReader list = cluster.RequiredChild("devices");
  for (size_t i = 0; i < list.size(); ++i) {
    ConfigReader d = list.At(i);
    d.RejectUnknownKeys({"name", "count", "type", "memory", "backend", "device", "ordinal"});
    DeviceSpec spec;
    spec.name = d.Required<std::string>("name");
    spec.type = d.Optional<std::string>("type", "gpu");
    spec.memory = d.RequiredBytes("memory");
    d.CheckPositive("memory", spec.memory);
    std::string backend = d.Optional<std::string>("backend", "virtual");
    auto b = ParseDeviceBackend(backend);
    d.Check(b.ok(), "backend", b.ok() ? "" : b.status().message());
    if (b.ok()) spec.backend = *b;
    int64_t count = d.Optional<int64_t>("count", 0);
    d.Check(count >= 0 && count <= 4096, "count", "must be between 1 and 4096");
    const std::vector<int64_t> indices = ReadCudaIndices(d, std::max<int64_t>(count, 1), b.ok() ? &*b : nullptr, backend);
    if (count <= 0) {
      spec.ordinal = static_cast<int>(indices[0]);
      devices.push_back(spec);
      device_readers.push_back(d);
    } else {
      for (int64_t k = 0; k < count && k <= 4096; ++k) {
        DeviceSpec c = spec;
        c.name = StrCat(spec.name, k);
        c.ordinal = static_cast<int>(indices[static_cast<size_t>(k)]);
        devices.push_back(c);
        device_readers.push_back(d);
      }
    }
  }
  if (list.present() && list.size() == 0) list.Error("must list at least one device");
  absl::flat_hash_set<std::string> names;
  for (size_t i = 0; i < devices.size(); ++i) {
    if (!devices[i].name.empty() && !names.insert(devices[i].name).second) {
      device_readers[i].Check(false, "name", StrCat("duplicate device name '", devices[i].name, "'"));
    }
  }

  ConfigReader links = cluster.Child("links");
  links.RejectUnknownKeys({"default", "pairs"});
  LinkSpec def{16e9, Duration::Micros(10)};
  def = ReadLink(links.Child("default"), def);

  AcceleratorSet set;
  if (!errors->ok()) return set;
  auto created = Create(devices, def);
  if (!created.ok()) {
    cluster.Error(created.status().message());
    return set;
  }
  set = *std::move(created);
  ConfigReader pairs = links.Child("pairs");
  for (size_t i = 0; i < pairs.size(); ++i) {
    ConfigReader p = pairs.At(i);
    p.RejectUnknownKeys({"between", "bandwidth", "latency"});
    ConfigReader between = p.RequiredChild("between");
    if (between.present() && between.size() != 2) {
      between.Error("must name exactly two devices");
      continue;
    }
    if (!between.present()) continue;
    auto a = set.FindDevice(between.At(0).As<std::string>());
    auto b = set.FindDevice(between.At(1).As<std::string>());
    if (!a.ok()) { between.At(0).Error(a.status().message()); continue; }
    if (!b.ok()) { between.At(1).Error(b.status().message()); continue; }
    LinkSpec link = ReadLink(p, def);
    absl::Status st = set.SetLink(*a, *b, link);
    if (!st.ok()) p.Error(st.message());
  }
  return set;
}

}  // namespace slicesched
