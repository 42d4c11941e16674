#include "slicesched/ymir/time_lut.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

namespace slicesched::ymir {
namespace {

constexpr int kAxes = 4;  // local_batch, grad_accum, frozen_layers, devices
constexpr const char* kAxisName[kAxes] = {"local_batch", "grad_accum", "frozen_layers", "devices"};
constexpr const char* kHeader =
    "devices,grad_accum,local_batch,frozen_layers,amp,grad_checkpoint,parallelism,seconds,samples";

int64_t& Axis(LutKey& k, int a) {
  switch (a) {
    case 0:
      return k.local_batch;
    case 1:
      return k.grad_accum;
    case 2:
      return k.frozen_layers;
    default:
      return k.devices;
  }
}
int64_t Axis(const LutKey& k, int a) { return Axis(const_cast<LutKey&>(k), a); }

bool SameCategory(const LutKey& a, const LutKey& b) {
  return a.amp == b.amp && a.grad_checkpoint == b.grad_checkpoint && a.parallelism == b.parallelism;
}

}  // namespace

const char* ParallelismName(Parallelism p) { return p == Parallelism::kData ? "data" : "pipeline"; }

absl::Status LutKey::Validate() const {
  if (devices < 1 || grad_accum < 1 || local_batch < 1 || frozen_layers < 0) {
    return absl::InvalidArgumentError(
        StrCat("LUT key ", ToString(), ": devices, grad_accum and local_batch must be >= 1, frozen_layers >= 0"));
  }
  return absl::OkStatus();
}

std::string LutKey::ToString() const {
  return absl::StrFormat("d=%d ga=%d b=%d frozen=%d amp=%d ckpt=%d %s", devices, grad_accum, local_batch,
                         frozen_layers, amp ? 1 : 0, grad_checkpoint ? 1 : 0, ParallelismName(parallelism));
}

absl::Status TimeLut::Set(const LutKey& key, double seconds, int64_t samples) {
  SLICESCHED_RETURN_IF_ERROR(key.Validate());
  if (!(seconds > 0) || !std::isfinite(seconds) || samples < 1) {
    return absl::InvalidArgumentError(StrCat("LUT entry ", key.ToString(), ": seconds ", seconds,
                                             " must be finite and > 0, samples ", samples, " >= 1"));
  }
  entries_[key] = LutEntry{seconds, samples};
  return absl::OkStatus();
}

absl::Status TimeLut::Update(const LutKey& key, double observed) {
  SLICESCHED_RETURN_IF_ERROR(key.Validate());
  if (!(alpha_ > 0 && alpha_ <= 1)) {
    return absl::InvalidArgumentError(StrCat("LUT ewma_alpha must be in (0, 1], got ", alpha_));
  }
  if (!(observed > 0) || !std::isfinite(observed)) {
    return absl::InvalidArgumentError(
        StrCat("LUT feedback for ", key.ToString(), ": observed seconds ", observed, " must be finite and > 0"));
  }
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    entries_[key] = LutEntry{observed, 1};
  } else {
    it->second.seconds = (1 - alpha_) * it->second.seconds + alpha_ * observed;
    ++it->second.samples;
  }
  return absl::OkStatus();
}

absl::StatusOr<LutLookup> TimeLut::Lookup(const LutKey& key) const {
  SLICESCHED_RETURN_IF_ERROR(key.Validate());
  if (auto it = entries_.find(key); it != entries_.end()) {
    return LutLookup{it->second.seconds, false, {key}};
  }
  SLICESCHED_ASSIGN_OR_RETURN(LutLookup r, Interpolate(key, 0));
  r.interpolated = true;
  std::sort(r.source.begin(), r.source.end());
  r.source.erase(std::unique(r.source.begin(), r.source.end()), r.source.end());
  return r;
}

absl::StatusOr<LutLookup> TimeLut::Interpolate(const LutKey& key, int axis) const {
  if (axis == kAxes) {
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      return absl::NotFoundError(StrCat("time LUT: no measurement for ", key.ToString(),
                                        ", which interpolation needs"));
    }
    return LutLookup{it->second.seconds, false, {key}};
  }
  // The measured values of this axis among entries that agree with `key` on
  // the categorical fields and on the axes already fixed (0..axis-1).
  std::set<int64_t> values;
  for (const auto& [k, e] : entries_) {
    if (!SameCategory(k, key)) continue;
    bool match = true;
    for (int a = 0; a < axis; ++a) match = match && Axis(k, a) == Axis(key, a);
    if (match) values.insert(Axis(k, axis));
  }
  const int64_t x = Axis(key, axis);
  if (values.count(x)) return Interpolate(key, axis + 1);
  if (values.size() < 2) {
    return absl::NotFoundError(StrCat("time LUT: cannot interpolate ", key.ToString(), " along ",
                                      kAxisName[axis], ": ", values.size(),
                                      " measured value(s) there"));
  }
  const std::vector<int64_t> v(values.begin(), values.end());
  auto hi = std::upper_bound(v.begin(), v.end(), x);
  size_t i1 = static_cast<size_t>(hi - v.begin());
  if (i1 == 0) i1 = 1;             // below the range: the two smallest
  if (i1 == v.size()) i1 = v.size() - 1;  // above: the two largest
  const int64_t x0 = v[i1 - 1], x1 = v[i1];
  LutKey k0 = key, k1 = key;
  Axis(k0, axis) = x0;
  Axis(k1, axis) = x1;
  SLICESCHED_ASSIGN_OR_RETURN(LutLookup y0, Interpolate(k0, axis + 1));
  SLICESCHED_ASSIGN_OR_RETURN(LutLookup y1, Interpolate(k1, axis + 1));
  double y = y0.seconds + (y1.seconds - y0.seconds) * double(x - x0) / double(x1 - x0);
  if (x < x0) y = std::max(y, 0.5 * y0.seconds);
  if (x > x1) y = std::max(y, 0.5 * y1.seconds);
  LutLookup r{y, true, y0.source};
  r.source.insert(r.source.end(), y1.source.begin(), y1.source.end());
  return r;
}

std::string TimeLut::ToCsv() const {
  std::string out = std::string(kHeader) + "\n";
  for (const auto& [k, e] : entries_) {
    out += absl::StrFormat("%d,%d,%d,%d,%d,%d,%s,%.9g,%d\n", k.devices, k.grad_accum, k.local_batch,
                           k.frozen_layers, k.amp ? 1 : 0, k.grad_checkpoint ? 1 : 0,
                           ParallelismName(k.parallelism), e.seconds, e.samples);
  }
  return out;
}

absl::StatusOr<TimeLut> TimeLut::FromCsv(const std::string& csv, double ewma_alpha) {
  TimeLut lut(ewma_alpha);
  std::istringstream in(csv);
  std::string line;
  int lineno = 0;
  bool header = false;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (!header) {
      if (line != kHeader) {
        return absl::InvalidArgumentError(StrCat("time LUT line ", lineno, ": expected the header '", kHeader, "'"));
      }
      header = true;
      continue;
    }
    const std::vector<std::string> f = absl::StrSplit(line, ',');
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(StrCat("time LUT line ", lineno, ": ", what, " in '", line, "'"));
    };
    if (f.size() != 9) return bad(StrCat("expected 9 fields, got ", f.size()));
    LutKey k;
    std::array<int64_t*, 4> ints = {&k.devices, &k.grad_accum, &k.local_batch, &k.frozen_layers};
    for (size_t i = 0; i < ints.size(); ++i) {
      if (!absl::SimpleAtoi(f[i], ints[i])) return bad(StrCat("field ", i + 1, " is not an integer"));
    }
    if ((f[4] != "0" && f[4] != "1") || (f[5] != "0" && f[5] != "1")) return bad("amp / grad_checkpoint must be 0 or 1");
    k.amp = f[4] == "1";
    k.grad_checkpoint = f[5] == "1";
    if (f[6] == "data") {
      k.parallelism = Parallelism::kData;
    } else if (f[6] == "pipeline") {
      k.parallelism = Parallelism::kPipeline;
    } else {
      return bad(StrCat("unknown parallelism '", f[6], "'"));
    }
    double seconds = 0;
    int64_t samples = 0;
    if (!absl::SimpleAtod(f[7], &seconds)) return bad("seconds is not a number");
    if (!absl::SimpleAtoi(f[8], &samples)) return bad("samples is not an integer");
    if (lut.entries_.count(k)) return bad(StrCat("duplicate key ", k.ToString()));
    if (absl::Status s = lut.Set(k, seconds, samples); !s.ok()) return bad(std::string(s.message()));
  }
  if (!header) return absl::InvalidArgumentError("time LUT: empty file (no header)");
  return lut;
}

absl::Status TimeLut::Save(const std::string& path) const {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return absl::UnavailableError(StrCat("cannot write the time LUT to ", path));
  f << ToCsv();
  f.close();
  if (!f) return absl::DataLossError(StrCat("writing the time LUT to ", path));
  return absl::OkStatus();
}

absl::StatusOr<TimeLut> TimeLut::Load(const std::string& path, double ewma_alpha) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(StrCat("cannot read the time LUT ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  auto r = FromCsv(ss.str(), ewma_alpha);
  if (!r.ok()) return Annotate(r.status(), path);
  return r;
}

}  // namespace slicesched::ymir
