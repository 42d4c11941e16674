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

void YmirGains::SetNeutral(const std::string& a, const std::string& b, ymir::Mode mode) {
  neutral_.insert(GainKey(a, b, mode));
}

bool YmirGains::Neutral(const std::string& a, const std::string& b, ymir::Mode mode) const {
  return neutral_.count(GainKey(a, b, mode)) > 0;
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
  if (neutral_rows > 0) {
    out += StrCat("; ", neutral_rows, " neutral rows: ",
                  pair_neutral ? "paired on their point estimates" : "interval includes 0, never paired");
  }
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
    const bool censored = censored_.count(key) > 0, neutral = neutral_.count(key) > 0;
    for (const auto& bb : backbones) {
      const std::string na = keep_a ? a : bb + "/" + a, nb = keep_b ? b : bb + "/" + b;
      out.Set(na, nb, m, gain);
      if (censored) out.SetCensored(na, nb, m);
      if (neutral) out.SetNeutral(na, nb, m);
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

// The parser of one gains table, line by line: comment directives, the
// header, then rows; Finish() folds the spatial speed-up rows and checks the
// table is not empty.
class GainsParser {
 public:
  GainsParser(const std::string& path, const YmirGainsLoadOptions& options)
      : path_(path), options_(options), def_(options.definition) {}

  absl::Status Line(int lineno, const std::string& line) {
    lineno_ = lineno;
    const std::string stripped(ToStd(absl::StripAsciiWhitespace(line)));
    if (stripped.empty()) return absl::OkStatus();
    if (stripped[0] == '#') return Comment(stripped);
    std::vector<std::string> f;
    for (absl::string_view p : absl::StrSplit(line, ',')) f.emplace_back(ToStd(absl::StripAsciiWhitespace(p)));
    return ca_ < 0 ? Header(f) : Row(f);
  }

  absl::StatusOr<YmirGains> Finish() {
    for (const auto& [pair, acc] : spatial_) {
      gains_.Set(pair.first, pair.second, ymir::Mode::kSpatial, 1 - acc.sum / acc.n);
      if (acc.censored) gains_.SetCensored(pair.first, pair.second, ymir::Mode::kSpatial);
      if (acc.neutral == acc.n && !options_.pair_neutral) {
        gains_.SetNeutral(pair.first, pair.second, ymir::Mode::kSpatial);
      }
    }
    if (ca_ < 0) return absl::InvalidArgumentError(StrCat(path_, ": empty gains table"));
    if (gains_.size() == 0) return absl::InvalidArgumentError(StrCat(path_, ": gains table has no rows"));
    src_.definition = def_.value_or(YmirGainsDefinition::kSaved) == YmirGainsDefinition::kSpeedup ? "speedup" : "saved";
    gains_.set_source(std::move(src_));
    return std::move(gains_);
  }

 private:
  absl::Status Err(const std::string& what) const {
    return absl::InvalidArgumentError(StrCat(path_, ":", lineno_, ": ", what));
  }

  // "# gains-format: 2", "# gain-definition: speedup", "# gain-measure: steps".
  absl::Status Comment(const std::string& stripped) {
    const std::string lower = absl::AsciiStrToLower(stripped);
    for (const char* key : {"gains-format", "gain-definition", "gain-measure"}) {
      std::optional<std::string> v = Directive(lower, key);
      if (!v) continue;
      if (ca_ >= 0) return Err(StrCat("the ", key, " comment must come before the header"));
      if (std::string(key) == "gains-format") {
        if (*v != "1" && *v != "2") return Err(StrCat("gains-format must be 1 or 2, got '", *v, "'"));
        src_.format = *v == "1" ? 1 : 2;
      } else if (std::string(key) == "gain-measure") {
        if (*v != "area" && *v != "steps") return Err(StrCat("gain-measure must be 'area' or 'steps', got '", *v, "'"));
        src_.measure = *v;
      } else {
        if (*v != "saved" && *v != "speedup") {
          return Err(StrCat("gain-definition must be 'saved' or 'speedup', got '", *v, "'"));
        }
        const YmirGainsDefinition d = *v == "saved" ? YmirGainsDefinition::kSaved : YmirGainsDefinition::kSpeedup;
        if (options_.definition && d != *options_.definition) {
          return Err(StrCat("the file says gain-definition '", *v, "', which contradicts the one asked for"));
        }
        def_ = d;
        def_stated_ = true;
      }
    }
    return absl::OkStatus();
  }

  absl::Status Header(const std::vector<std::string>& f) {
    for (size_t i = 0; i < f.size(); ++i) {
      std::string h = absl::AsciiStrToLower(f[i]);
      if (h == "task_a") ca_ = static_cast<int>(i);
      if (h == "task_b") cb_ = static_cast<int>(i);
      if (h == "mode") cm_ = static_cast<int>(i);
      if (h == "gain") cg_ = static_cast<int>(i);
      if (h == "gain_steps") cs_ = static_cast<int>(i);
      if (h == "steps_censored") cc_ = static_cast<int>(i);
      if (h == "sign") csign_ = static_cast<int>(i);
    }
    const std::initializer_list<std::pair<int, const char*>> columns = {
        {ca_, "task_a"}, {cb_, "task_b"}, {cm_, "mode"}, {cg_, "gain"}};
    for (auto [c, name] : columns) {
      if (c < 0) return Err(StrCat("missing column '", name, "'"));
    }
    // The format decides the columns: format 2 must have both steps
    // columns, format 1 none (a steps column there is unversioned).
    for (auto [c, name] : {std::pair{cs_, "gain_steps"}, std::pair{cc_, "steps_censored"}}) {
      if (src_.format == 2 && c < 0) return Err(StrCat("gains-format 2 needs the column '", name, "'"));
      if (src_.format == 1 && c >= 0) {
        return Err(StrCat("column '", name, "' needs a '# gains-format: 2' line before the header"));
      }
    }
    if (src_.format == 2) {
      if (def_stated_ && *def_ != YmirGainsDefinition::kSpeedup) {
        return Err("gains-format 2 is a speed-up table, but the file says gain-definition 'saved'");
      }
      if (def_ && *def_ != YmirGainsDefinition::kSpeedup) {
        return Err("gains-format 2 is a speed-up table; the definition 'saved' asked for contradicts it");
      }
      def_ = YmirGainsDefinition::kSpeedup;
    } else if (options_.column == "gain_steps") {
      return Err("gain_steps asked for, but the file is gains-format 1 (one gain column)");
    }
    use_steps_ = src_.format == 2 && options_.column != "gain";
    src_.column = use_steps_ ? "gain_steps" : "gain";
    src_.pair_neutral = options_.pair_neutral;
    ncols_ = f.size();
    return absl::OkStatus();
  }

  // A gain in column `col`: finite, and above -1 (speed-up) or below 1 (saved).
  absl::Status Number(const std::vector<std::string>& f, int col, const char* name, bool speedup, double* v) const {
    const std::string& text = f[static_cast<size_t>(col)];
    if (!absl::SimpleAtod(text, v) || !std::isfinite(*v) || (speedup ? *v <= -1 : *v >= 1)) {
      return Err(StrCat("column '", name, "': expected a finite number ", speedup ? "above -1" : "below 1",
                        " (gain-definition ", speedup ? "speedup" : "saved", "), got '", text, "'"));
    }
    return absl::OkStatus();
  }

  absl::Status Row(const std::vector<std::string>& f) {
    if (f.size() < ncols_) return Err(StrCat("expected ", ncols_, " fields, got ", f.size()));
    const std::string& a = f[static_cast<size_t>(ca_)];
    const std::string& b = f[static_cast<size_t>(cb_)];
    if (a.empty() || b.empty()) return Err("empty task name");
    if (a == b) return Err(StrCat("task '", a, "' paired with itself"));
    std::string m = absl::AsciiStrToLower(f[static_cast<size_t>(cm_)]);
    ymir::Mode mode;
    if (m == "temporal") {
      mode = ymir::Mode::kTemporal;
    } else if (m == "spatial") {
      mode = ymir::Mode::kSpatial;
    } else {
      return Err(StrCat("column 'mode': expected temporal or spatial, got '", f[static_cast<size_t>(cm_)], "'"));
    }
    const bool speedup = def_.value_or(YmirGainsDefinition::kSaved) == YmirGainsDefinition::kSpeedup;
    double gain = 0;
    SLICESCHED_RETURN_IF_ERROR(Number(f, cg_, "gain", speedup, &gain));
    bool censored = false;
    if (src_.format == 2) {
      double steps = 0;
      SLICESCHED_RETURN_IF_ERROR(Number(f, cs_, "gain_steps", speedup, &steps));
      const std::string& c = f[static_cast<size_t>(cc_)];
      if (c != "0" && c != "1") return Err(StrCat("column 'steps_censored': expected 0 or 1, got '", c, "'"));
      if (src_.measure == "steps" && std::abs(gain - steps) > 1e-6) {
        return Err(StrCat("gain-measure is 'steps', but gain ", f[static_cast<size_t>(cg_)],
                          " differs from gain_steps ", f[static_cast<size_t>(cs_)]));
      }
      if (use_steps_) {
        gain = steps;
        censored = c == "1";
        src_.censored_rows += censored ? 1 : 0;
      }
    }
    bool neutral = false;
    if (csign_ >= 0) {
      const std::string sign = absl::AsciiStrToLower(f[static_cast<size_t>(csign_)]);
      if (sign != "positive" && sign != "negative" && sign != "neutral") {
        return Err(StrCat("column 'sign': expected positive, negative or neutral, got '",
                          f[static_cast<size_t>(csign_)], "'"));
      }
      neutral = sign == "neutral";
      src_.neutral_rows += neutral ? 1 : 0;
    }
    // Duplicates: ordered rows for temporal and for kSpeedup spatial
    // (whose (A,B) and (B,A) rows are the two tasks' gains), unordered for
    // kSaved spatial.
    auto key = mode == ymir::Mode::kSpatial && !speedup ? GainKey(a, b, mode) : std::make_tuple(a, b, ModeKey(mode));
    if (!seen_.emplace(key, lineno_).second) {
      return Err(StrCat("duplicate ", m, " gain for ", a, ", ", b, " (first on line ", seen_[key], ")"));
    }
    if (mode == ymir::Mode::kSpatial && speedup) {
      Spatial& acc = spatial_[{std::min(a, b), std::max(a, b)}];
      acc.sum += 1 / (1 + gain);
      acc.n += 1;
      acc.censored = acc.censored || censored;
      acc.neutral += neutral ? 1 : 0;
      return absl::OkStatus();
    }
    gains_.Set(a, b, mode, speedup ? gain / (1 + gain) : gain);
    if (censored) gains_.SetCensored(a, b, mode);
    if (neutral && !options_.pair_neutral) gains_.SetNeutral(a, b, mode);
    return absl::OkStatus();
  }

  const std::string& path_;
  const YmirGainsLoadOptions& options_;
  int lineno_ = 0;
  int ca_ = -1, cb_ = -1, cm_ = -1, cg_ = -1, cs_ = -1, cc_ = -1, csign_ = -1;
  size_t ncols_ = 0;
  YmirGains gains_;
  YmirGainsSource src_{.format = 1};
  std::optional<YmirGainsDefinition> def_;
  bool def_stated_ = false;
  bool use_steps_ = false;
  std::map<std::tuple<std::string, std::string, int>, int> seen_;
  // kSpeedup spatial rows: per unordered pair, the sum and count of 1 /
  // (1 + gain), any censored, and how many are neutral.
  struct Spatial {
    double sum = 0;
    int n = 0;
    bool censored = false;
    int neutral = 0;
  };
  std::map<std::pair<std::string, std::string>, Spatial> spatial_;
};

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
  GainsParser parser(path, options);
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (lineno == 1 && line.size() >= 3 && line.compare(0, 3, "\xEF\xBB\xBF") == 0) line = line.substr(3);
    SLICESCHED_RETURN_IF_ERROR(parser.Line(lineno, line));
  }
  return parser.Finish();
}
}  // namespace slicesched::ymir
