#include "slicesched/experiments/ymir_sim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <queue>
#include <random>
#include <sstream>
#include <system_error>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "slicesched/common/option_checks.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/workload/trace.h"

namespace slicesched {
namespace {

constexpr double kWorkEps = 1e-6;  // 1-GPU seconds

uint64_t Fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double Unit01(uint64_t h) { return static_cast<double>(Mix(h) >> 11) * 0x1.0p-53; }

// Standard normal from two hashes (Box-Muller; our own code so the values do
// not depend on the standard library).
double Normal(uint64_t h) {
  double u1 = std::max(Unit01(h), 1e-300);
  double u2 = Unit01(h ^ 0x5851f42d4c957f2dull);
  return std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
}

int ModeKey(ymir::Mode m) { return m == ymir::Mode::kSpatial ? 1 : 0; }

// Spatial gains are symmetric: keyed by the unordered pair.
std::tuple<std::string, std::string, int> GainKey(const std::string& a, const std::string& b, ymir::Mode mode) {
  return mode == ymir::Mode::kSpatial ? std::make_tuple(std::min(a, b), std::max(a, b), 1)
                                      : std::make_tuple(a, b, ModeKey(mode));
}

}  // namespace

// --- Gains -------------------------------------------------------------------

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

// --- Workload ------------------------------------------------------------------

absl::StatusOr<std::vector<YmirSimJob>> LoadYmirJobs(const std::string& trace_path, int jobs, double load,
                                                     uint64_t seed, int cluster_gpus, const YmirGains& gains) {
  if (jobs < 1) return absl::InvalidArgumentError(StrCat("--jobs must be >= 1, got ", jobs));
  if (!(load > 0) || !std::isfinite(load)) return absl::InvalidArgumentError(StrCat("--load must be > 0, got ", load));
  if (cluster_gpus < 1) return absl::InvalidArgumentError("the cluster needs at least one GPU");
  const std::vector<std::string> tasks = gains.Tasks();
  if (tasks.empty()) return absl::InvalidArgumentError("the gains table names no tasks");
  SLICESCHED_ASSIGN_OR_RETURN(std::vector<Job> all, LoadJobTrace(trace_path));
  std::vector<Job> kept;
  for (const Job& j : all) {
    if (j.duration_s >= 60 && j.duration_s * j.num_gpus < 1000.0 * 3600 && j.num_gpus <= cluster_gpus) {
      kept.push_back(j);
    }
  }
  if (kept.empty()) {
    return absl::InvalidArgumentError(StrCat(trace_path, ": no job has duration >= 60 s, gpu_time < 1000 h and <= ",
                                             cluster_gpus, " GPUs"));
  }
  const size_t n = std::min(kept.size(), static_cast<size_t>(jobs));
  std::mt19937_64 rng(seed);
  const size_t start = static_cast<size_t>(rng() % (kept.size() - n + 1));
  std::vector<YmirSimJob> out;
  const double t0 = kept[start].submit_s;
  for (size_t i = start; i < start + n; ++i) {
    YmirSimJob j;
    j.submit_s = (kept[i].submit_s - t0) / load;
    j.duration_s = kept[i].duration_s;
    j.trace_gpus = kept[i].num_gpus;
    j.task = tasks[static_cast<size_t>(rng() % tasks.size())];
    out.push_back(std::move(j));
  }
  return out;
}

double YmirSpeedup(const YmirSimConfig& c, double g) {
  if (g <= 0) return 0;
  return g / (1 + c.sigma * (g - 1));
}

// --- Policies -----------------------------------------------------------------

namespace {

double RemainingTime(const YmirSimState& s, const YmirUnitView& u, int g) {
  return u.remaining_work / YmirSpeedup(*s.config, g);
}

// Greedy fit in `order`, each unit at its trace GPU count (non-elastic).
YmirSimDecision FitInOrder(const YmirSimState& s, const std::vector<int>& order) {
  YmirSimDecision d;
  d.gpus.assign(s.units.size(), 0);
  int free = s.config->gpus;
  for (int i : order) {
    int g = s.units[static_cast<size_t>(i)].trace_gpus;
    if (g <= free) {
      d.gpus[static_cast<size_t>(i)] = g;
      free -= g;
    }
  }
  return d;
}

std::vector<int> Indices(size_t n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

class SrtfPolicy : public YmirSimPolicy {
 public:
  std::string Name() const override { return "SRTF"; }
  absl::StatusOr<YmirSimDecision> Decide(const YmirSimState& s) override {
    std::vector<int> order = Indices(s.units.size());
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      const auto& ua = s.units[static_cast<size_t>(a)];
      const auto& ub = s.units[static_cast<size_t>(b)];
      double ta = RemainingTime(s, ua, ua.trace_gpus), tb = RemainingTime(s, ub, ub.trace_gpus);
      if (ta != tb) return ta < tb;
      return ua.uid < ub.uid;
    });
    return FitInOrder(s, order);
  }
};

class TiresiasPolicy : public YmirSimPolicy {
 public:
  std::string Name() const override { return "Tiresias"; }
  absl::StatusOr<YmirSimDecision> Decide(const YmirSimState& s) override {
    auto queue = [](double attained) { return attained < 3600 ? 0 : attained < 36000 ? 1 : 2; };
    std::vector<int> order = Indices(s.units.size());
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      const auto& ua = s.units[static_cast<size_t>(a)];
      const auto& ub = s.units[static_cast<size_t>(b)];
      int qa = queue(ua.attained_gpu_s), qb = queue(ub.attained_gpu_s);
      if (qa != qb) return qa < qb;
      if (ua.submit_s != ub.submit_s) return ua.submit_s < ub.submit_s;
      return ua.uid < ub.uid;
    });
    return FitInOrder(s, order);
  }
};

class ThemisPolicy : public YmirSimPolicy {
 public:
  std::string Name() const override { return "Themis"; }
  absl::StatusOr<YmirSimDecision> Decide(const YmirSimState& s) override {
    std::vector<double> rho(s.units.size());
    for (size_t i = 0; i < s.units.size(); ++i) {
      const auto& u = s.units[i];
      double ideal = u.total_work / YmirSpeedup(*s.config, u.trace_gpus);
      rho[i] = ((s.now - u.submit_s) + RemainingTime(s, u, u.trace_gpus)) / ideal;
    }
    // Running jobs whose lease has not ended keep their GPUs; the others
    // compete by rho, and winners get a new lease.
    std::vector<bool> leased(s.units.size(), false);
    for (size_t i = 0; i < s.units.size(); ++i) {
      auto it = lease_end_.find(s.units[i].uid);
      leased[i] = s.units[i].gpus > 0 && it != lease_end_.end() && it->second > s.now + 1e-9;
    }
    std::vector<int> order = Indices(s.units.size());
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      if (leased[static_cast<size_t>(a)] != leased[static_cast<size_t>(b)]) return static_cast<bool>(leased[static_cast<size_t>(a)]);
      if (rho[static_cast<size_t>(a)] != rho[static_cast<size_t>(b)]) {
        return rho[static_cast<size_t>(a)] > rho[static_cast<size_t>(b)];
      }
      return s.units[static_cast<size_t>(a)].uid < s.units[static_cast<size_t>(b)].uid;
    });
    YmirSimDecision d = FitInOrder(s, order);
    std::map<uint64_t, double> next;
    for (size_t i = 0; i < s.units.size(); ++i) {
      if (d.gpus[i] == 0) continue;
      const uint64_t uid = s.units[i].uid;
      next[uid] = leased[i] ? lease_end_[uid] : s.now + kLeaseS;
    }
    lease_end_ = std::move(next);
    return d;
  }

 private:
  static constexpr double kLeaseS = 600;
  std::map<uint64_t, double> lease_end_;
};

// Optimus and Pollux: 1 GPU each in FIFO order, then marginal-gain steps.
class MarginalPolicy : public YmirSimPolicy {
 public:
  explicit MarginalPolicy(bool pollux) : pollux_(pollux) {}
  std::string Name() const override { return pollux_ ? "Pollux" : "Optimus"; }
  absl::StatusOr<YmirSimDecision> Decide(const YmirSimState& s) override {
    const YmirSimConfig& c = *s.config;
    YmirSimDecision d;
    d.gpus.assign(s.units.size(), 0);
    std::vector<int> order = Indices(s.units.size());
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      const auto& ua = s.units[static_cast<size_t>(a)];
      const auto& ub = s.units[static_cast<size_t>(b)];
      if (ua.submit_s != ub.submit_s) return ua.submit_s < ub.submit_s;
      return ua.uid < ub.uid;
    });
    int free = c.gpus;
    const double fair_g = std::max(1.0, static_cast<double>(c.gpus) / std::max<size_t>(1, s.units.size()));
    std::vector<int> step(s.units.size(), 0);  // index into allowed_gpus
    // value(i, g): lower is better; the greedy maximises the drop per GPU.
    auto value = [&](size_t i, int g) {
      const auto& u = s.units[i];
      if (pollux_) {
        double fair = YmirSpeedup(c, std::min<double>(fair_g, u.allowed_gpus.back()));
        return fair / YmirSpeedup(c, g);  // 1 / normalised speedup (p = -1 mean)
      }
      return RemainingTime(s, u, g);
    };
    using Item = std::tuple<double, uint64_t, size_t>;  // gain per GPU, -uid, unit
    std::priority_queue<Item> heap;
    auto push = [&](size_t i) {
      const auto& u = s.units[i];
      size_t k = static_cast<size_t>(step[i]);
      if (k + 1 >= u.allowed_gpus.size()) return;
      int g = u.allowed_gpus[k], g2 = u.allowed_gpus[k + 1];
      double gain = (value(i, g) - value(i, g2)) / (g2 - g);
      if (gain > 0) heap.push({gain, ~u.uid, i});
    };
    for (int i : order) {
      int g = s.units[static_cast<size_t>(i)].allowed_gpus.front();
      if (g <= free) {
        d.gpus[static_cast<size_t>(i)] = g;
        free -= g;
        push(static_cast<size_t>(i));
      }
    }
    while (free > 0 && !heap.empty()) {
      auto [gain, unused, i] = heap.top();
      heap.pop();
      const auto& u = s.units[i];
      int g2 = u.allowed_gpus[static_cast<size_t>(step[i]) + 1];
      int add = g2 - d.gpus[i];
      if (add > free) continue;  // this step no longer fits; the job stays
      free -= add;
      d.gpus[i] = g2;
      ++step[i];
      push(i);
    }
    return d;
  }

 private:
  bool pollux_;
};

class YmirPolicy : public YmirSimPolicy {
 public:
  explicit YmirPolicy(bool transfer) : transfer_(transfer) {}
  std::string Name() const override { return transfer_ ? "Ymir" : "Ymir-elastic"; }

  absl::StatusOr<YmirSimDecision> Decide(const YmirSimState& s) override {
    const YmirSimConfig& c = *s.config;
    const size_t n = s.units.size();
    YmirSimDecision d;
    d.gpus.assign(n, 0);
    if (n == 0) return d;
    if (!s.round) {
      int used = 0;
      bool waiting = false;
      for (const auto& u : s.units) {
        used += u.gpus;
        waiting |= u.gpus == 0;
      }
      if (used >= c.gpus || !waiting) {
        for (size_t i = 0; i < n; ++i) d.gpus[i] = s.units[i].gpus;
        return d;
      }
    }
    // Fair share: the cluster split evenly over the active JOBS; a transfer
    // unit holds the shares of its members (speed: members x the speed of
    // one share), so pairing does not cost a job its share.
    size_t active_jobs = 0;
    for (const auto& u : s.units) active_jobs += c.ymir_pair_shares ? u.jobs.size() : 1;
    const double fair_g = std::max(1.0, static_cast<double>(c.gpus) / static_cast<double>(active_jobs));
    std::vector<double> fair(n), slowdown(n), ref_time(n);
    for (size_t i = 0; i < n; ++i) {
      const auto& u = s.units[i];
      const double shares = c.ymir_pair_shares ? static_cast<double>(u.jobs.size()) : 1.0;
      ref_time[i] = 1.0 / (shares *
                           YmirSpeedup(c, std::min<double>(fair_g, u.allowed_gpus.back())));
      fair[i] = std::max(1e-9, u.total_work * ref_time[i]);
      int g = u.gpus > 0 ? u.gpus : 0;
      double rest = g > 0 ? RemainingTime(s, u, g) : RemainingTime(s, u, u.allowed_gpus.back()) + c.round_s;
      slowdown[i] = (s.now - u.submit_s + rest) / fair[i];
    }
    // The window: the units with the largest current slowdown.
    std::vector<int> order = Indices(n);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      if (slowdown[static_cast<size_t>(a)] != slowdown[static_cast<size_t>(b)]) {
        return slowdown[static_cast<size_t>(a)] > slowdown[static_cast<size_t>(b)];
      }
      return s.units[static_cast<size_t>(a)].uid < s.units[static_cast<size_t>(b)].uid;
    });
    const size_t window = std::min(n, static_cast<size_t>(std::max(1, c.ilp_window)));
    std::vector<bool> in(n, false);
    if (c.ilp_donors) {
      // Half the window: the units with the largest slowdown (they most need
      // GPUs); the other half: the running units with the smallest slowdown
      // (they can best spare GPUs), so the ILP can move GPUs between them
      // and not only hand out what completions freed.
      std::vector<int> picked;
      const size_t needy = (window + 1) / 2;
      for (size_t k = 0; k < needy; ++k) picked.push_back(order[k]);
      for (size_t k = n; k-- > needy && picked.size() < window;) {
        if (s.units[static_cast<size_t>(order[k])].gpus > 0) picked.push_back(order[k]);
      }
      for (size_t k = needy; k < n && picked.size() < window; ++k) {
        if (std::find(picked.begin(), picked.end(), order[k]) == picked.end()) picked.push_back(order[k]);
      }
      std::vector<int> reordered = picked;
      for (int i : order) {
        if (std::find(picked.begin(), picked.end(), i) == picked.end()) reordered.push_back(i);
      }
      order = std::move(reordered);
    }
    for (size_t k = 0; k < window; ++k) in[static_cast<size_t>(order[k])] = true;
    int capacity = c.gpus;
    for (size_t i = 0; i < n; ++i) {
      if (!in[i]) {
        d.gpus[i] = s.units[i].gpus;
        capacity -= s.units[i].gpus;
      }
    }
    std::vector<ymir::JobView> views;
    std::unordered_map<uint64_t, size_t> by_uid;
    for (size_t k = 0; k < window; ++k) {
      size_t i = static_cast<size_t>(order[k]);
      const auto& u = s.units[i];
      ymir::JobView v;
      v.id = u.uid;
      v.backbone = u.task.empty() ? std::string("-") : YmirBackbone(u.task);
      v.allow_sharing = u.pairable;
      v.has_progress = !u.fresh;
      v.min_gpus = u.allowed_gpus.front();
      v.max_gpus = u.allowed_gpus.back();
      v.remaining_iterations = u.remaining_work;
      v.iter_time_s.assign(static_cast<size_t>(v.max_gpus) + 1, 0.0);
      for (int g : u.allowed_gpus) v.iter_time_s[static_cast<size_t>(g)] = 1.0 / YmirSpeedup(c, g);
      // The reconfiguration cost the simulator charges (a resize, or resuming
      // a unit that ran before); a unit's first start is free.
      v.current_gpus = u.gpus;
      v.restart_s = u.ran && u.remaining_work > 0 ? c.restart_s : 0.0;
      v.reference_iter_time_s = ref_time[i];
      v.fair_share_jct_s = fair[i];
      v.waited_s = std::max(0.0, s.now - u.submit_s);
      by_uid[u.uid] = i;
      views.push_back(std::move(v));
    }
    std::vector<ymir::PairEstimate> pairs;
    if (transfer_) pairs = Pairs(s, order, window);
    ymir::PlannerOptions po;
    po.lambda = c.lambda;
    po.round_s = c.round_s;
    po.time_limit_s = c.ilp_time_limit_s;
    po.relative_gap = c.ilp_gap;
    po.horizon_s = c.ymir_horizon_s < 0 ? c.round_s : c.ymir_horizon_s;
    SLICESCHED_ASSIGN_OR_RETURN(ymir::PlanResult plan,
                                ymir::Plan(views, pairs, {std::max(0, capacity), c.gpus_per_node}, po));
    d.solve_s = plan.solve_seconds;
    for (const ymir::Assignment& a : plan.assignments) {
      if (a.mode == ymir::Mode::kWait) continue;
      size_t i0 = by_uid.at(a.jobs[0]);
      if (a.mode == ymir::Mode::kNormal) {
        d.gpus[i0] = a.gpus;
        continue;
      }
      d.pairs.push_back({static_cast<int>(i0), static_cast<int>(by_uid.at(a.jobs[1])), a.mode, a.gpus});
    }
    return d;
  }

 private:
  // Each pairable target's best partners by predicted gain (> 0).
  std::vector<ymir::PairEstimate> Pairs(const YmirSimState& s, const std::vector<int>& order, size_t window) const {
    const YmirSimConfig& c = *s.config;
    std::vector<ymir::PairEstimate> out;
    for (size_t kb = 0; kb < window; ++kb) {
      const auto& B = s.units[static_cast<size_t>(order[kb])];
      if (!B.fresh || !B.pairable) continue;
      struct Cand {
        double score;
        uint64_t uid;
        ymir::PairEstimate ab, ba;
        bool has_ba;
      };
      std::vector<Cand> cands;
      for (size_t ka = 0; ka < window; ++ka) {
        const auto& A = s.units[static_cast<size_t>(order[ka])];
        if (ka == kb || !A.pairable || YmirBackbone(A.task) != YmirBackbone(B.task)) continue;
        double t_ab = 0, sp = 0;
        bool has_t = s.gains->Plannable(A.task, B.task, ymir::Mode::kTemporal, &t_ab);
        bool has_s = A.fresh && s.gains->Plannable(A.task, B.task, ymir::Mode::kSpatial, &sp);
        double best = std::max(has_t ? t_ab : 0.0, has_s ? sp : 0.0);
        if (!(best > 0)) continue;
        Cand cd{best, A.uid, {}, {}, false};
        cd.ab = {A.uid, B.uid, has_t ? t_ab : -1.0, has_s ? sp : -1.0, c.spatial_overhead};
        // With both fresh, the reverse direction is the same unordered pair:
        // it is offered from B's side only when B is the source of a better
        // temporal transfer, so give it here too.
        double t_ba = 0;
        if (A.fresh && s.gains->Plannable(B.task, A.task, ymir::Mode::kTemporal, &t_ba)) {
          cd.ba = {B.uid, A.uid, t_ba, has_s ? sp : -1.0, c.spatial_overhead};
          cd.has_ba = true;
        }
        cands.push_back(cd);
      }
      std::stable_sort(cands.begin(), cands.end(), [](const Cand& x, const Cand& y) {
        if (x.score != y.score) return x.score > y.score;
        return x.uid < y.uid;
      });
      if (cands.size() > static_cast<size_t>(c.partners_per_job)) cands.resize(static_cast<size_t>(c.partners_per_job));
      for (const Cand& cd : cands) {
        out.push_back(cd.ab);
        if (cd.has_ba) out.push_back(cd.ba);
      }
    }
    return out;
  }

  bool transfer_;
};

}  // namespace

std::vector<std::string> YmirSimPolicyNames() {
  return {"Ymir", "Ymir-elastic", "Tiresias", "Optimus", "Pollux", "Themis", "SRTF"};
}

absl::StatusOr<std::unique_ptr<YmirSimPolicy>> MakeYmirSimPolicy(const std::string& name) {
  if (name == "Ymir") return std::make_unique<YmirPolicy>(true);
  if (name == "Ymir-elastic") return std::make_unique<YmirPolicy>(false);
  if (name == "Tiresias") return std::make_unique<TiresiasPolicy>();
  if (name == "Optimus") return std::make_unique<MarginalPolicy>(false);
  if (name == "Pollux") return std::make_unique<MarginalPolicy>(true);
  if (name == "Themis") return std::make_unique<ThemisPolicy>();
  if (name == "SRTF") return std::make_unique<SrtfPolicy>();
  std::string names;
  for (const auto& n : YmirSimPolicyNames()) names += (names.empty() ? "" : ", ") + n;
  return absl::InvalidArgumentError(StrCat("unknown policy '", name, "' (known: ", names, ", all)"));
}

// --- The simulator ------------------------------------------------------------

namespace {

struct Unit {
  uint64_t uid = 0;
  YmirUnitMode mode = YmirUnitMode::kSingle;
  std::vector<int> jobs;
  int gpus = 0;
  bool ran = false;          // has ever held GPUs
  double stall_until = 0;
  double held_since = 0;     // when the current GPU count was set
  double remaining = 0;      // work of the current phase (realized)
  double future_real = 0;    // temporal phase 1 work still to come (realized)
  double future_pred = 0;    // the same as the planner predicts it
  double attained = 0;
  double realized_gain = 0;
  double decouple_at = -1;   // remaining work at which stop-loss fires (< 0: never)
  int phase = 0;             // temporal: 0 = source, 1 = target
};

class Simulator {
 public:
  Simulator(const std::vector<YmirSimJob>& jobs, const YmirGains& gains, const YmirSimConfig& config,
            YmirSimPolicy& policy)
      : jobs_(jobs), gains_(gains), c_(config), policy_(policy) {}

  absl::StatusOr<YmirSimResult> Run() {
    SLICESCHED_RETURN_IF_ERROR(Validate());
    const size_t n = jobs_.size();
    work_.resize(n);
    progress_.assign(n, false);
    tried_.assign(n, false);
    for (size_t i = 0; i < n; ++i) work_[i] = jobs_[i].duration_s * YmirSpeedup(c_, jobs_[i].trace_gpus);
    std::vector<int> arrival = IndicesSorted();
    result_.policy = policy_.Name();
    result_.jobs.assign(n, {});
    size_t next_arrival = 0;
    size_t done = 0;
    double now = 0;
    double next_tick = 0;
    std::vector<double> ilp;
    while (done < n) {
      double t = std::numeric_limits<double>::infinity();
      if (next_arrival < n) t = jobs_[static_cast<size_t>(arrival[next_arrival])].submit_s;
      if (!units_.empty()) t = std::min(t, next_tick);
      for (const Unit& u : units_) t = std::min(t, EventTime(u, now));
      if (!std::isfinite(t)) return absl::InternalError(StrCat(Name(), ": no next event with ", n - done, " jobs left"));
      t = std::max(t, now);
      Advance(now, t);
      now = t;
      // Unit events: phase ends, completions, stop-loss.
      std::vector<Unit> next_units;
      for (Unit& u : units_) {
        bool keep = true;
        for (int guard = 0; guard < 3 && keep; ++guard) {
          if (u.decouple_at >= 0 && u.remaining <= u.decouple_at + kWorkEps) {
            Decouple(u, now, &next_units);
            keep = false;
          } else if (u.remaining <= kWorkEps) {
            if (u.mode == YmirUnitMode::kTemporal && u.phase == 0) {
              Finish(u.jobs[0], now, u);
              ++done;
              u.phase = 1;
              u.remaining = u.future_real;
              u.future_real = u.future_pred = 0;
              if (u.realized_gain < 0) {
                u.decouple_at = std::max(0.0, u.remaining - c_.stop_loss_epochs / c_.epochs * work_[u.jobs[1]]);
              }
            } else {
              for (size_t k = (u.mode == YmirUnitMode::kTemporal ? 1 : 0); k < u.jobs.size(); ++k) {
                Finish(u.jobs[k], now, u);
                ++done;
              }
              keep = false;
            }
          } else {
            break;
          }
        }
        if (keep) next_units.push_back(std::move(u));
      }
      units_ = std::move(next_units);
      while (next_arrival < n && jobs_[static_cast<size_t>(arrival[next_arrival])].submit_s <= now) {
        Unit u;
        u.uid = next_uid_++;
        int j = arrival[next_arrival++];
        u.jobs = {j};
        u.remaining = work_[static_cast<size_t>(j)];
        units_.push_back(std::move(u));
      }
      const bool round = next_tick <= now;
      while (next_tick <= now) next_tick += c_.round_s;
      if (done == n) break;
      SLICESCHED_RETURN_IF_ERROR(Schedule(now, round, &ilp));
      bool any_running = std::any_of(units_.begin(), units_.end(), [](const Unit& u) { return u.gpus > 0; });
      if (!any_running && next_arrival >= n && !units_.empty()) {
        return absl::InternalError(StrCat(Name(), " left ", units_.size(), " units waiting on an idle cluster"));
      }
    }
    // Metrics.
    std::vector<double> jct;
    double first = std::numeric_limits<double>::infinity(), last = 0;
    for (size_t i = 0; i < n; ++i) {
      const auto& o = result_.jobs[i];
      jct.push_back(o.jct_s);
      first = std::min(first, jobs_[i].submit_s);
      last = std::max(last, o.finish_s);
      if (o.transfer == ymir::Mode::kTemporal) ++result_.temporal_jobs;
      if (o.transfer == ymir::Mode::kSpatial) ++result_.spatial_jobs;
      if (o.decoupled) ++result_.decoupled_jobs;
    }
    result_.avg_jct_s = std::accumulate(jct.begin(), jct.end(), 0.0) / static_cast<double>(n);
    std::sort(jct.begin(), jct.end());
    double rank = 0.99 * static_cast<double>(n - 1);
    size_t lo = static_cast<size_t>(std::floor(rank));
    size_t hi = std::min(n - 1, lo + 1);
    result_.p99_jct_s = jct[lo] + (jct[hi] - jct[lo]) * (rank - static_cast<double>(lo));
    result_.makespan_s = last - first;
    result_.transfer_share = static_cast<double>(result_.temporal_jobs + result_.spatial_jobs) / static_cast<double>(n);
    result_.ilp_calls = static_cast<int>(ilp.size());
    if (!ilp.empty()) {
      result_.ilp_avg_s = std::accumulate(ilp.begin(), ilp.end(), 0.0) / static_cast<double>(ilp.size());
      result_.ilp_max_s = *std::max_element(ilp.begin(), ilp.end());
    }
    return std::move(result_);
  }

 private:
  std::string Name() const { return policy_.Name(); }

  absl::Status Validate() const {
    if (jobs_.empty()) return absl::InvalidArgumentError("no jobs to simulate");
    if (c_.gpus < 1 || c_.gpus_per_node < 1) {
      return absl::InvalidArgumentError(StrCat("bad cluster: ", c_.gpus, " GPUs, ", c_.gpus_per_node, " per node"));
    }
    if (!(c_.round_s > 0) || c_.restart_s < 0 || !(c_.epochs > 0) || c_.sigma < 0 || c_.sigma >= 1) {
      return absl::InvalidArgumentError("bad simulator config");
    }
    for (size_t i = 0; i < jobs_.size(); ++i) {
      const auto& j = jobs_[i];
      if (!(j.submit_s >= 0) || !(j.duration_s > 0) || j.trace_gpus < 1 || j.trace_gpus > c_.gpus) {
        return absl::InvalidArgumentError(StrCat("job ", i, ": bad submit/duration/GPUs (", j.submit_s, ", ",
                                                 j.duration_s, ", ", j.trace_gpus, " on a ", c_.gpus,
                                                 "-GPU cluster)"));
      }
    }
    return absl::OkStatus();
  }

  std::vector<int> IndicesSorted() const {
    std::vector<int> v = Indices(jobs_.size());
    std::stable_sort(v.begin(), v.end(), [&](int a, int b) {
      return jobs_[static_cast<size_t>(a)].submit_s < jobs_[static_cast<size_t>(b)].submit_s;
    });
    return v;
  }

  double Rate(const Unit& u) const { return YmirSpeedup(c_, u.gpus); }

  // When the unit's current phase ends or its stop-loss fires.
  double EventTime(const Unit& u, double now) const {
    if (u.gpus <= 0) return std::numeric_limits<double>::infinity();
    double target = u.decouple_at >= 0 ? u.decouple_at : 0;
    return std::max(now, u.stall_until) + std::max(0.0, u.remaining - target) / Rate(u);
  }

  void Advance(double from, double to) {
    for (Unit& u : units_) {
      if (u.gpus <= 0) continue;
      u.attained += u.gpus * (to - from);
      double busy = to - std::max(from, u.stall_until);
      if (busy <= 0) continue;
      u.remaining -= busy * Rate(u);
      if (u.mode == YmirUnitMode::kTemporal) {
        progress_[static_cast<size_t>(u.jobs[static_cast<size_t>(u.phase)])] = true;
      } else {
        for (int j : u.jobs) progress_[static_cast<size_t>(j)] = true;
      }
    }
  }

  void Finish(int j, double now, const Unit& u) {
    auto& o = result_.jobs[static_cast<size_t>(j)];
    o.finish_s = now;
    o.jct_s = now - jobs_[static_cast<size_t>(j)].submit_s;
    o.final_gpus = u.gpus;
    if (u.mode == YmirUnitMode::kTemporal) o.transfer = ymir::Mode::kTemporal;
    if (u.mode == YmirUnitMode::kSpatial) o.transfer = ymir::Mode::kSpatial;
  }

  // Stop-loss: the transferring phase's work so far is lost; the jobs that
  // are left continue alone with their full iterations.
  void Decouple(const Unit& u, double now, std::vector<Unit>* out) {
    size_t first = u.mode == YmirUnitMode::kTemporal ? 1 : 0;
    for (size_t k = first; k < u.jobs.size(); ++k) {
      int j = u.jobs[k];
      result_.jobs[static_cast<size_t>(j)].decoupled = true;
      result_.jobs[static_cast<size_t>(j)].transfer =
          u.mode == YmirUnitMode::kTemporal ? ymir::Mode::kTemporal : ymir::Mode::kSpatial;
      Unit s;
      s.uid = next_uid_++;
      s.jobs = {j};
      s.remaining = work_[static_cast<size_t>(j)];
      s.ran = true;
      s.attained = u.attained / static_cast<double>(u.jobs.size() - first);
      out->push_back(std::move(s));
    }
    log_line_ += StrCat(" decouple ", u.uid, "@", now);
  }

  YmirUnitView View(const Unit& u) const {
    YmirUnitView v;
    v.uid = u.uid;
    v.mode = u.mode;
    v.jobs = u.jobs;
    v.gpus = u.gpus;
    v.held_since_s = u.held_since;
    v.ran = u.ran;
    v.submit_s = std::numeric_limits<double>::infinity();
    for (int j : u.jobs) {
      const auto& job = jobs_[static_cast<size_t>(j)];
      v.submit_s = std::min(v.submit_s, job.submit_s);
      v.total_work += work_[static_cast<size_t>(j)];
      v.trace_gpus = std::max(v.trace_gpus, job.trace_gpus);
    }
    v.remaining_work = std::max(0.0, u.remaining) + u.future_pred;
    v.attained_gpu_s = u.attained;
    int max_g = std::min(c_.gpus, std::max(c_.gpus_per_node, 2 * v.trace_gpus));
    for (int g = 1; g <= max_g; g *= 2) v.allowed_gpus.push_back(g);
    if (v.trace_gpus <= max_g) v.allowed_gpus.push_back(v.trace_gpus);
    std::sort(v.allowed_gpus.begin(), v.allowed_gpus.end());
    v.allowed_gpus.erase(std::unique(v.allowed_gpus.begin(), v.allowed_gpus.end()), v.allowed_gpus.end());
    if (u.mode == YmirUnitMode::kSingle) {
      int j = u.jobs[0];
      v.task = jobs_[static_cast<size_t>(j)].task;
      v.fresh = !progress_[static_cast<size_t>(j)] && !u.ran;
      v.pairable = !tried_[static_cast<size_t>(j)];
    }
    return v;
  }

  double Realized(const std::string& a, const std::string& b, ymir::Mode mode, double predicted) const {
    uint64_t h = Fnv1a(b, Fnv1a(a, Mix(c_.seed))) ^ static_cast<uint64_t>(ModeKey(mode) + 1);
    double g = predicted + std::abs(predicted) * c_.gain_noise_rel * Normal(h) + c_.gain_noise_abs * Normal(Mix(h));
    return std::min(g, 0.95);
  }

  absl::Status Schedule(double now, bool round, std::vector<double>* ilp) {
    YmirSimState state;
    state.now = now;
    state.round = round;
    state.config = &c_;
    state.gains = &gains_;
    for (const Unit& u : units_) state.units.push_back(View(u));
    SLICESCHED_ASSIGN_OR_RETURN(YmirSimDecision d, policy_.Decide(state));
    ++result_.decisions;
    if (d.solve_s >= 0) ilp->push_back(d.solve_s);
    const size_t n = units_.size();
    if (d.gpus.size() != n) {
      return absl::InternalError(StrCat(Name(), " returned ", d.gpus.size(), " allocations for ", n, " units"));
    }
    std::string line = StrCat("t=", now, ":");
    std::vector<bool> paired(n, false);
    std::vector<Unit> formed;
    for (const auto& p : d.pairs) {
      if (p.source < 0 || p.target < 0 || static_cast<size_t>(p.source) >= n || static_cast<size_t>(p.target) >= n ||
          p.source == p.target || paired[static_cast<size_t>(p.source)] || paired[static_cast<size_t>(p.target)]) {
        return absl::InternalError(StrCat(Name(), ": bad pair ", p.source, " -> ", p.target));
      }
      const Unit& A = units_[static_cast<size_t>(p.source)];
      const Unit& B = units_[static_cast<size_t>(p.target)];
      const YmirUnitView va = state.units[static_cast<size_t>(p.source)];
      const YmirUnitView vb = state.units[static_cast<size_t>(p.target)];
      double pred = 0;
      const bool spatial = p.mode == ymir::Mode::kSpatial;
      if (A.mode != YmirUnitMode::kSingle || B.mode != YmirUnitMode::kSingle || !va.pairable || !vb.pairable ||
          !vb.fresh || (spatial && !va.fresh) || YmirBackbone(va.task) != YmirBackbone(vb.task) ||
          !gains_.Get(va.task, vb.task, p.mode, &pred) ||
          std::find(va.allowed_gpus.begin(), va.allowed_gpus.end(), p.gpus) == va.allowed_gpus.end()) {
        return absl::InternalError(StrCat(Name(), ": ineligible ", ymir::ModeName(p.mode), " pair ", va.uid, " -> ",
                                          vb.uid, " on ", p.gpus, " GPUs"));
      }
      paired[static_cast<size_t>(p.source)] = paired[static_cast<size_t>(p.target)] = true;
      const int a = A.jobs[0], b = B.jobs[0];
      tried_[static_cast<size_t>(a)] = tried_[static_cast<size_t>(b)] = true;
      Unit u;
      u.uid = next_uid_++;
      u.jobs = {a, b};
      u.realized_gain = Realized(va.task, vb.task, p.mode, pred);
      u.attained = A.attained;
      if (spatial) {
        u.mode = YmirUnitMode::kSpatial;
        const double w = (work_[static_cast<size_t>(a)] + work_[static_cast<size_t>(b)]) * c_.spatial_overhead;
        u.remaining = (1 - u.realized_gain) * w;
        if (u.realized_gain < 0) u.decouple_at = u.remaining - c_.stop_loss_epochs / c_.epochs * w;
      } else {
        u.mode = YmirUnitMode::kTemporal;
        u.remaining = A.remaining;
        u.future_real = (1 - u.realized_gain) * work_[static_cast<size_t>(b)];
        u.future_pred = (1 - pred) * work_[static_cast<size_t>(b)];
        u.ran = A.ran;
        u.gpus = A.gpus;  // for the restart rule below
        u.stall_until = A.stall_until;
      }
      line += StrCat(" ", ymir::ModeName(p.mode), "(", A.uid, ",", B.uid, ")->", u.uid, "@", p.gpus);
      formed.push_back(std::move(u));
      SetGpus(&formed.back(), p.gpus, now);
    }
    std::vector<Unit> next;
    for (size_t i = 0; i < n; ++i) {
      if (paired[i]) continue;
      Unit& u = units_[i];
      int g = d.gpus[i];
      if (g != 0) {
        const auto& allowed = state.units[i].allowed_gpus;
        if (std::find(allowed.begin(), allowed.end(), g) == allowed.end()) {
          return absl::InternalError(StrCat(Name(), ": unit ", u.uid, " given ", g, " GPUs (not an allowed count)"));
        }
      }
      if (g != u.gpus) line += StrCat(" ", u.uid, ":", u.gpus, "->", g);
      SetGpus(&u, g, now);
      next.push_back(std::move(u));
    }
    for (Unit& u : formed) next.push_back(std::move(u));
    units_ = std::move(next);
    // Capacity: in total and per node.
    std::vector<int> counts;
    int used = 0;
    for (const Unit& u : units_) {
      if (u.gpus > 0) counts.push_back(u.gpus);
      used += u.gpus;
    }
    if (used > c_.gpus) {
      return absl::InternalError(StrCat(Name(), " over-allocated at t=", now, ": ", used, " GPUs on ", c_.gpus));
    }
    SLICESCHED_ASSIGN_OR_RETURN(auto placement, ymir::PackOntoNodes(counts, {c_.gpus, c_.gpus_per_node}));
    std::vector<int> node_used(static_cast<size_t>((c_.gpus + c_.gpus_per_node - 1) / c_.gpus_per_node), 0);
    for (const auto& slices : placement) {
      for (const auto& s : slices) {
        node_used[static_cast<size_t>(s.node)] += s.gpus;
        if (node_used[static_cast<size_t>(s.node)] > c_.gpus_per_node) {
          return absl::InternalError(StrCat(Name(), " over-allocated node ", s.node, " at t=", now));
        }
      }
    }
    result_.peak_gpus = std::max(result_.peak_gpus, used);
    result_.log.push_back(line + log_line_);
    log_line_.clear();
    return absl::OkStatus();
  }

  void SetGpus(Unit* u, int g, double now) {
    if (g > 0 && ((u->gpus > 0 && g != u->gpus) || (u->gpus == 0 && u->ran))) {
      u->stall_until = now + c_.restart_s;
      ++result_.restarts;
    }
    if (g > 0) u->ran = true;
    if (g != u->gpus) u->held_since = now;
    u->gpus = g;
  }

  const std::vector<YmirSimJob>& jobs_;
  const YmirGains& gains_;
  const YmirSimConfig& c_;
  YmirSimPolicy& policy_;
  std::vector<double> work_;
  std::vector<bool> progress_, tried_;
  std::vector<Unit> units_;
  uint64_t next_uid_ = 1;
  YmirSimResult result_;
  std::string log_line_;
};

}  // namespace

absl::StatusOr<YmirSimResult> RunYmirSim(const std::vector<YmirSimJob>& jobs, const YmirGains& gains,
                                         const YmirSimConfig& config, YmirSimPolicy& policy) {
  Simulator sim(jobs, gains, config, policy);
  return sim.Run();
}

// --- Reporting and the command ---------------------------------------------

std::string YmirSimResult::ToJson() const {
  char buf[1024];
  std::snprintf(buf, sizeof(buf),
                "{\"policy\": \"%s\", \"avg_jct_s\": %.1f, \"p99_jct_s\": %.1f, \"makespan_s\": %.1f, "
                "\"transfer_share\": %.4f, \"temporal_jobs\": %d, \"spatial_jobs\": %d, \"decoupled_jobs\": %d, "
                "\"restarts\": %d, \"decisions\": %d, \"peak_gpus\": %d, \"ilp_calls\": %d, "
                "\"ilp_avg_s\": %s, \"ilp_max_s\": %s}",
                policy.c_str(), avg_jct_s, p99_jct_s, makespan_s, transfer_share, temporal_jobs, spatial_jobs,
                decoupled_jobs, restarts, decisions, peak_gpus, ilp_calls,
                ilp_calls > 0 ? StrCat(ilp_avg_s).c_str() : "null", ilp_calls > 0 ? StrCat(ilp_max_s).c_str() : "null");
  return buf;
}

std::string YmirCompareResult::ToJson(const YmirCompareOptions& o) const {
  std::string out = StrCat("{\"trace\": \"", trace, "\", \"gains\": \"", gains, "\", \"gains_used\": \"",
                           gains_source.Describe(), "\", \"gains_column\": \"",
                           gains_source.format == 0 ? "stand-in" : gains_source.column,
                           "\", \"gains_censored_rows\": ", gains_source.censored_rows, ", \"jobs\": ", jobs,
                           ", \"load\": ", o.load, ", \"gpus\": ", o.config.gpus, ", \"nodes\": ", o.nodes,
                           ", \"seed\": ", o.config.seed, ", \"policies\": [");
  for (size_t i = 0; i < policies.size(); ++i) out += (i ? ",\n  " : "\n  ") + policies[i].ToJson();
  return out + "\n]}";
}

std::string YmirCompareResult::ToText() const {
  std::string out = StrCat(jobs, " jobs from ", trace, "; gains: ", gains, " [", gains_source.Describe(), "]\n");
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%-13s %11s %11s %11s %9s %9s %11s %11s\n", "policy", "avg JCT s", "p99 JCT s",
                "makespan s", "transfer", "restarts", "ILP avg s", "ILP max s");
  out += buf;
  for (const auto& p : policies) {
    std::snprintf(buf, sizeof(buf), "%-13s %11.0f %11.0f %11.0f %8.1f%% %9d %11.4f %11.4f\n", p.policy.c_str(),
                  p.avg_jct_s, p.p99_jct_s, p.makespan_s, 100 * p.transfer_share, p.restarts, p.ilp_avg_s,
                  p.ilp_max_s);
    out += buf;
  }
  return out;
}

absl::Status YmirCompareOptions::Validate() const {
  if (jobs < 1) return OptionOutOfRange("--jobs", "at least 1", jobs);
  if (!(load > 0) || !std::isfinite(load)) return OptionOutOfRange("--load", "> 0", load);
  if (config.gpus < 1) return OptionOutOfRange("--gpus", "at least 1", config.gpus);
  if (nodes < 1) return OptionOutOfRange("--nodes", "at least 1", nodes);
  if (config.gpus % nodes != 0) {
    return absl::InvalidArgumentError(
        StrCat("--gpus (", config.gpus, ") must be a multiple of --nodes (", nodes, ")"));
  }
  if (!(config.round_s > 0) || !std::isfinite(config.round_s)) {
    return OptionOutOfRange("--round", "> 0", config.round_s);
  }
  if (!(config.restart_s >= 0) || !std::isfinite(config.restart_s)) {
    return OptionOutOfRange("--restart", "at least 0", config.restart_s);
  }
  if (config.ilp_window < 1) return OptionOutOfRange("--ilp-window", "at least 1", config.ilp_window);
  if (!(config.ilp_gap >= 0) || !std::isfinite(config.ilp_gap)) {
    return OptionOutOfRange("--ilp-gap", "at least 0", config.ilp_gap);
  }
  if (!(config.ilp_time_limit_s > 0) || !std::isfinite(config.ilp_time_limit_s)) {
    return OptionOutOfRange("--ilp-time-limit", "> 0", config.ilp_time_limit_s);
  }
  if (policy != "all") {
    const std::vector<std::string> names = YmirSimPolicyNames();
    if (std::find(names.begin(), names.end(), policy) == names.end()) {
      return OptionOutOfRange("--policy", "Ymir, Ymir-elastic, Tiresias, Optimus, Pollux, Themis, SRTF or all", policy);
    }
  }
  if (!gains_definition.empty() && gains_definition != "saved" && gains_definition != "speedup") {
    return OptionOutOfRange("--gains-definition", "saved or speedup", gains_definition);
  }
  if (!gains_column.empty() && gains_column != "gain" && gains_column != "gain_steps") {
    return OptionOutOfRange("--gains-column", "gain or gain_steps", gains_column);
  }
  return absl::OkStatus();
}

absl::StatusOr<YmirCompareResult> RunYmirCompare(const YmirCompareOptions& options) {
  SLICESCHED_RETURN_IF_ERROR(options.Validate());
  YmirCompareOptions o = options;
  o.config.gpus_per_node = o.config.gpus / o.nodes;
  YmirCompareResult r;
  if (o.trace.empty()) {
#ifdef SLICESCHED_SOURCE_DIR
    std::string shared = std::string(SLICESCHED_SOURCE_DIR) + "/../shared";
#else
    std::string shared = "../shared";
#endif
    if (!o.shared_dir.empty()) shared = o.shared_dir;
    if (!std::ifstream(shared + "/traces/philly_jobs_pollux.csv")) {
      return absl::NotFoundError(StrCat("no --trace given and the default trace ", shared,
                                        "/traces/philly_jobs_pollux.csv is absent; pass --trace FILE (a job table "
                                        "with timestamp, duration, num_gpus columns)"));
    }
    o.trace = shared + "/traces/philly_jobs_pollux.csv";
  }
  YmirGains gains;
  if (o.gains.empty()) {
    gains = DefaultYmirGains();
    r.gains = "default stand-in (paper's reported distribution, not measured)";
  } else {
    YmirGainsLoadOptions load{.column = o.gains_column};
    if (!o.gains_definition.empty()) {  // else the file's directive (Validate() checked the name)
      load.definition = o.gains_definition == "saved" ? YmirGainsDefinition::kSaved : YmirGainsDefinition::kSpeedup;
    }
    SLICESCHED_ASSIGN_OR_RETURN(gains, LoadYmirGains(o.gains, load));
    r.gains = o.gains;
    const std::vector<std::string> tasks = gains.Tasks();
    if (std::none_of(tasks.begin(), tasks.end(), [](const std::string& t) { return t.find('/') != std::string::npos; })) {
      if (o.backbones.empty()) return absl::InvalidArgumentError("no backbones to map the gains table's tasks onto");
      gains = gains.WithBackbones(o.backbones);
      r.gains += " (tasks replicated per backbone:";
      for (const auto& bb : o.backbones) r.gains += " " + bb;
      r.gains += ")";
    }
  }
  r.gains_source = gains.source();
  SLICESCHED_ASSIGN_OR_RETURN(std::vector<YmirSimJob> jobs,
                              LoadYmirJobs(o.trace, o.jobs, o.load, o.config.seed, o.config.gpus, gains));
  r.trace = o.trace;
  r.jobs = static_cast<int>(jobs.size());
  std::vector<std::string> names = o.policy == "all" ? YmirSimPolicyNames() : std::vector<std::string>{o.policy};
  for (const auto& name : names) {
    SLICESCHED_ASSIGN_OR_RETURN(auto policy, MakeYmirSimPolicy(name));
    SLICESCHED_ASSIGN_OR_RETURN(YmirSimResult res, RunYmirSim(jobs, gains, o.config, *policy));
    res.log.clear();
    r.policies.push_back(std::move(res));
  }
  return r;
}

}  // namespace slicesched
