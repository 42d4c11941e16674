#include "slicesched/ymir/gains.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "slicesched/common/hash.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

namespace slicesched::ymir {
namespace {

int ModeKey(ymir::Mode m) { return m == ymir::Mode::kSpatial ? 1 : 0; }

// Spatial gains are symmetric: keyed by the unordered pair.
std::tuple<std::string, std::string, int> GainKey(const std::string& a, const std::string& b, ymir::Mode mode) {
  return mode == ymir::Mode::kSpatial ? std::make_tuple(std::min(a, b), std::max(a, b), 1)
                                      : std::make_tuple(a, b, ModeKey(mode));
}

}  // namespace

void YmirGains::Set(const std::string& a, const std::string& b, ymir::Mode mode, double gain) {
  AddTask(a);
  AddTask(b);
  gains_[GainKey(a, b, mode)] = gain;
}

bool YmirGains::Get(const std::string& a, const std::string& b, ymir::Mode mode, double* gain) const {
  auto it = gains_.find(GainKey(a, b, mode));
  if (it == gains_.end()) return false;
  *gain = it->second;
  return true;
}

void YmirGains::SetCensored(const std::string& a, const std::string& b, ymir::Mode mode) {
  censored_.insert(GainKey(a, b, mode));
}

bool YmirGains::Censored(const std::string& a, const std::string& b, ymir::Mode mode) const {
  return censored_.count(GainKey(a, b, mode)) > 0;
}

std::string YmirGainsSource::Describe() const {
  if (format == 0) return "stand-in (fraction of iterations saved)";
  std::string out = StrCat(column, " (format ", format, ", ", definition);
  if (column == "gain_steps") {
    out += " in steps to target";
  } else if (!measure.empty()) {
    out += StrCat(", gain-measure ", measure);
  }
  if (censored_rows > 0) out += StrCat("; ", censored_rows, " censored rows: bounds, never paired");
  return out + ")";
}

std::vector<std::string> YmirGains::Tasks() const {
  std::vector<std::string> out;
  for (const auto& [t, unused] : tasks_) out.push_back(t);
  return out;
}

void YmirGains::AddTask(const std::string& task) { tasks_.emplace(task, 0); }

YmirGains YmirGains::WithBackbones(const std::vector<std::string>& backbones) const {
  YmirGains out;
  auto names = [&](const std::string& t) {
    if (t.find('/') != std::string::npos) return std::vector<std::string>{t};
    std::vector<std::string> v;
    for (const auto& bb : backbones) v.push_back(bb + "/" + t);
    return v;
  };
  for (const auto& [t, unused] : tasks_) {
    for (const auto& n : names(t)) out.AddTask(n);
  }
  for (const auto& [key, gain] : gains_) {
    const auto& [a, b, mode] = key;
    const bool keep_a = a.find('/') != std::string::npos, keep_b = b.find('/') != std::string::npos;
    const ymir::Mode m = mode == 1 ? ymir::Mode::kSpatial : ymir::Mode::kTemporal;
    const bool censored = censored_.count(key) > 0;
    for (const auto& bb : backbones) {
      const std::string na = keep_a ? a : bb + "/" + a, nb = keep_b ? b : bb + "/" + b;
      out.Set(na, nb, m, gain);
      if (censored) out.SetCensored(na, nb, m);
    }
  }
  out.source_ = source_;
  return out;
}

std::string YmirBackbone(const std::string& task) {
  size_t slash = task.find('/');
  return slash == std::string::npos ? task : task.substr(0, slash);
}

YmirGains DefaultYmirGains() {
  // STAND-IN, not measured: see the header comment. Families of 3 tasks per
  // backbone; names follow the paper's kinds of datasets.
  const std::vector<std::pair<std::string, std::vector<std::vector<std::string>>>> backbones = {
      {"vit-base", {{"food101", "cifar100", "imagenet75"}, {"dtd", "flowers102", "pets"},
                    {"eurosat", "resisc45", "pcam"}}},
      {"roberta-base", {{"stsb", "qqp", "mrpc"}, {"sst2", "imdb", "yelp"}, {"mnli", "rte", "qnli"}}},
      {"vicuna-7b", {{"samsum", "cnn_dm", "xsum"}, {"gsm8k", "svamp", "aqua"},
                     {"alpaca", "dolly", "oasst"}}},
  };
  YmirGains g;
  for (const auto& [bb, families] : backbones) {
    std::vector<std::pair<std::string, int>> tasks;
    for (size_t f = 0; f < families.size(); ++f) {
      for (const auto& t : families[f]) tasks.push_back({bb + "/" + t, static_cast<int>(f)});
    }
    for (const auto& [a, fa] : tasks) {
      for (const auto& [b, fb] : tasks) {
        if (a == b) continue;
        const bool same = fa == fb;
        double u = Unit01(Fnv1a(b, Fnv1a(a)) ^ 0x7e);
        g.Set(a, b, ymir::Mode::kTemporal, same ? 0.25 + 0.35 * u : -0.30 + 0.35 * u);
        if (a < b) {
          double v = Unit01(Fnv1a(b, Fnv1a(a)) ^ 0x5a);
          g.Set(a, b, ymir::Mode::kSpatial, same ? 0.20 + 0.30 * v : -0.35 + 0.35 * v);
        }
      }
    }
  }
  return g;
}

namespace {

// The value of a "# key: value" directive in a comment line (lower case), or
// nullopt when the line has none.
std::optional<std::string> Directive(const std::string& lower, const std::string& key) {
  const size_t k = lower.find(key + ":");
  if (k == std::string::npos) return std::nullopt;
  return std::string(ToStd(absl::StripAsciiWhitespace(lower.substr(k + key.size() + 1))));
}

}  // namespace

absl::StatusOr<YmirGains> LoadYmirGains(const std::string& path, const YmirGainsLoadOptions& options) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    // An ifstream opens a directory and reads nothing ("empty gains table").
    return absl::InvalidArgumentError(StrCat(path, ": is a directory, expected a gains table (a CSV file)"));
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(StrCat(path, ": cannot open gains table"));
  if (!options.column.empty() && options.column != "gain" && options.column != "gain_steps") {
    return absl::InvalidArgumentError(
        StrCat("gains column (--gains-column) must be 'gain' or 'gain_steps', got '", options.column, "'"));
  }
  std::string line;
  int lineno = 0;
  int ca = -1, cb = -1, cm = -1, cg = -1, cs = -1, cc = -1;
  size_t ncols = 0;
  YmirGains gains;
  YmirGainsSource src{.format = 1};
  std::optional<YmirGainsDefinition> def = options.definition;
  bool def_stated = false;
  bool use_steps = false;
  std::map<std::tuple<std::string, std::string, int>, int> seen;
  // kSpeedup spatial rows: per unordered pair, the sum and count of 1 / (1 + gain), and any censored.
  struct Spatial {
    double sum = 0;
    int n = 0;
    bool censored = false;
  };
  std::map<std::pair<std::string, std::string>, Spatial> spatial;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (lineno == 1 && line.size() >= 3 && line.compare(0, 3, "\xEF\xBB\xBF") == 0) line = line.substr(3);
    const std::string stripped(ToStd(absl::StripAsciiWhitespace(line)));
    if (stripped.empty()) continue;
    auto err = [&](const std::string& what) {
      return absl::InvalidArgumentError(StrCat(path, ":", lineno, ": ", what));
    };
    if (stripped[0] == '#') {
      const std::string lower = absl::AsciiStrToLower(stripped);
      for (const char* key : {"gains-format", "gain-definition", "gain-measure"}) {
        std::optional<std::string> v = Directive(lower, key);
        if (!v) continue;
        if (ca >= 0) return err(StrCat("the ", key, " comment must come before the header"));
        if (std::string(key) == "gains-format") {
          if (*v != "1" && *v != "2") return err(StrCat("gains-format must be 1 or 2, got '", *v, "'"));
          src.format = *v == "1" ? 1 : 2;
        } else if (std::string(key) == "gain-measure") {
          if (*v != "area" && *v != "steps") return err(StrCat("gain-measure must be 'area' or 'steps', got '", *v, "'"));
          src.measure = *v;
        } else {
          if (*v != "saved" && *v != "speedup") {
            return err(StrCat("gain-definition must be 'saved' or 'speedup', got '", *v, "'"));
          }
          const YmirGainsDefinition d = *v == "saved" ? YmirGainsDefinition::kSaved : YmirGainsDefinition::kSpeedup;
          if (options.definition && d != *options.definition) {
            return err(StrCat("the file says gain-definition '", *v, "', which contradicts the one asked for"));
          }
          def = d;
          def_stated = true;
        }
      }
      continue;
    }
    std::vector<std::string> f;
    for (absl::string_view p : absl::StrSplit(line, ',')) {
      f.emplace_back(ToStd(absl::StripAsciiWhitespace(p)));
    }
    if (ca < 0) {
      for (size_t i = 0; i < f.size(); ++i) {
        std::string h = absl::AsciiStrToLower(f[i]);
        if (h == "task_a") ca = static_cast<int>(i);
        if (h == "task_b") cb = static_cast<int>(i);
        if (h == "mode") cm = static_cast<int>(i);
        if (h == "gain") cg = static_cast<int>(i);
        if (h == "gain_steps") cs = static_cast<int>(i);
        if (h == "steps_censored") cc = static_cast<int>(i);
      }
      const std::initializer_list<std::pair<int, const char*>> columns = {
          {ca, "task_a"}, {cb, "task_b"}, {cm, "mode"}, {cg, "gain"}};
      for (auto [c, name] : columns) {
        if (c < 0) return err(StrCat("missing column '", name, "'"));
      }
      // The format decides the columns: format 2 must have both steps
      // columns, format 1 none (a steps column there is unversioned).
      for (auto [c, name] : {std::pair{cs, "gain_steps"}, std::pair{cc, "steps_censored"}}) {
        if (src.format == 2 && c < 0) return err(StrCat("gains-format 2 needs the column '", name, "'"));
        if (src.format == 1 && c >= 0) {
          return err(StrCat("column '", name, "' needs a '# gains-format: 2' line before the header"));
        }
      }
      if (src.format == 2) {
        if (def_stated && *def != YmirGainsDefinition::kSpeedup) {
          return err("gains-format 2 is a speed-up table, but the file says gain-definition 'saved'");
        }
        if (def && *def != YmirGainsDefinition::kSpeedup) {
          return err("gains-format 2 is a speed-up table; the definition 'saved' asked for contradicts it");
        }
        def = YmirGainsDefinition::kSpeedup;
      } else if (options.column == "gain_steps") {
        return err("gain_steps asked for, but the file is gains-format 1 (one gain column)");
      }
      use_steps = src.format == 2 && options.column != "gain";
      src.column = use_steps ? "gain_steps" : "gain";
      ncols = f.size();
      continue;
    }
    if (f.size() < ncols) return err(StrCat("expected ", ncols, " fields, got ", f.size()));
    const std::string& a = f[static_cast<size_t>(ca)];
    const std::string& b = f[static_cast<size_t>(cb)];
    if (a.empty() || b.empty()) return err("empty task name");
    if (a == b) return err(StrCat("task '", a, "' paired with itself"));
    std::string m = absl::AsciiStrToLower(f[static_cast<size_t>(cm)]);
    ymir::Mode mode;
    if (m == "temporal") {
      mode = ymir::Mode::kTemporal;
    } else if (m == "spatial") {
      mode = ymir::Mode::kSpatial;
    } else {
      return err(StrCat("column 'mode': expected temporal or spatial, got '", f[static_cast<size_t>(cm)], "'"));
    }
    const bool speedup = def.value_or(YmirGainsDefinition::kSaved) == YmirGainsDefinition::kSpeedup;
    auto number = [&](int col, const char* name, double* v) -> absl::Status {
      const std::string& text = f[static_cast<size_t>(col)];
      if (!absl::SimpleAtod(text, v) || !std::isfinite(*v) || (speedup ? *v <= -1 : *v >= 1)) {
        return err(StrCat("column '", name, "': expected a finite number ", speedup ? "above -1" : "below 1",
                          " (gain-definition ", speedup ? "speedup" : "saved", "), got '", text, "'"));
      }
      return absl::OkStatus();
    };
    double gain = 0;
    SLICESCHED_RETURN_IF_ERROR(number(cg, "gain", &gain));
    bool censored = false;
    if (src.format == 2) {
      double steps = 0;
      SLICESCHED_RETURN_IF_ERROR(number(cs, "gain_steps", &steps));
      const std::string& c = f[static_cast<size_t>(cc)];
      if (c != "0" && c != "1") return err(StrCat("column 'steps_censored': expected 0 or 1, got '", c, "'"));
      if (src.measure == "steps" && std::abs(gain - steps) > 1e-6) {
        return err(StrCat("gain-measure is 'steps', but gain ", f[static_cast<size_t>(cg)], " differs from gain_steps ",
                          f[static_cast<size_t>(cs)]));
      }
      if (use_steps) {
        gain = steps;
        censored = c == "1";
        src.censored_rows += censored ? 1 : 0;
      }
    }
    // Duplicates: ordered rows for temporal and for kSpeedup spatial
    // (whose (A,B) and (B,A) rows are the two tasks' gains), unordered for
    // kSaved spatial.
    auto key = mode == ymir::Mode::kSpatial && !speedup ? GainKey(a, b, mode) : std::make_tuple(a, b, ModeKey(mode));
    if (!seen.emplace(key, lineno).second) {
      return err(StrCat("duplicate ", m, " gain for ", a, ", ", b, " (first on line ", seen[key], ")"));
    }
    if (mode == ymir::Mode::kSpatial && speedup) {
      Spatial& acc = spatial[{std::min(a, b), std::max(a, b)}];
      acc.sum += 1 / (1 + gain);
      acc.n += 1;
      acc.censored = acc.censored || censored;
      continue;
    }
    gains.Set(a, b, mode, speedup ? gain / (1 + gain) : gain);
    if (censored) gains.SetCensored(a, b, mode);
  }
  for (const auto& [pair, acc] : spatial) {
    gains.Set(pair.first, pair.second, ymir::Mode::kSpatial, 1 - acc.sum / acc.n);
    if (acc.censored) gains.SetCensored(pair.first, pair.second, ymir::Mode::kSpatial);
  }
  if (ca < 0) return absl::InvalidArgumentError(StrCat(path, ": empty gains table"));
  if (gains.size() == 0) return absl::InvalidArgumentError(StrCat(path, ": gains table has no rows"));
  src.definition = def.value_or(YmirGainsDefinition::kSaved) == YmirGainsDefinition::kSpeedup ? "speedup" : "saved";
  gains.set_source(std::move(src));
  return gains;
}
}  // namespace slicesched::ymir
