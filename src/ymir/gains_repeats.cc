#include "slicesched/ymir/gains_repeats.h"

#include <cmath>
#include <map>
#include <sstream>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "slicesched/common/strings.h"

namespace slicesched::ymir {
namespace {

struct Row {
  double gain = 0, gain_steps = 0;
  int censored = 0;
};
using Key = std::tuple<std::string, std::string, std::string>;  // task_a, task_b, mode

struct Table {
  std::string definition, measure;
  std::map<Key, Row> rows;
};

absl::StatusOr<Table> ParseTable(const std::string& name, const std::string& text) {
  Table t;
  std::map<std::string, int> col;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  auto err = [&](const std::string& what) {
    return absl::InvalidArgumentError(StrCat(name, ":", lineno, ": ", what));
  };
  while (std::getline(in, line)) {
    ++lineno;
    absl::string_view l = absl::StripAsciiWhitespace(line);
    if (l.empty()) continue;
    if (l[0] == '#') {
      absl::string_view body = absl::StripAsciiWhitespace(l.substr(1));
      if (absl::ConsumePrefix(&body, "gain-definition:")) t.definition = std::string(absl::StripAsciiWhitespace(body));
      if (absl::ConsumePrefix(&body, "gain-measure:")) t.measure = std::string(absl::StripAsciiWhitespace(body));
      continue;
    }
    std::vector<std::string> f = absl::StrSplit(l, ',');
    if (col.empty()) {
      for (size_t i = 0; i < f.size(); ++i) col[f[i]] = static_cast<int>(i);
      for (const char* need : {"task_a", "task_b", "mode", "gain", "gain_steps", "steps_censored"}) {
        if (!col.contains(need)) return err(StrCat("no column '", need, "' (want a gains-format 2 table)"));
      }
      continue;
    }
    auto at = [&](const char* c) -> const std::string& {
      static const std::string kEmpty;
      const size_t i = static_cast<size_t>(col[c]);
      return i < f.size() ? f[i] : kEmpty;
    };
    Row r;
    if (!absl::SimpleAtod(at("gain"), &r.gain) || !std::isfinite(r.gain)) return err(StrCat("gain '", at("gain"), "'"));
    if (!absl::SimpleAtod(at("gain_steps"), &r.gain_steps)) return err(StrCat("gain_steps '", at("gain_steps"), "'"));
    if (!absl::SimpleAtoi(at("steps_censored"), &r.censored)) return err(StrCat("steps_censored '", at("steps_censored"), "'"));
    const Key k{at("task_a"), at("task_b"), at("mode")};
    if (!t.rows.emplace(k, r).second) {
      return err(StrCat("the row ", std::get<0>(k), ",", std::get<1>(k), ",", std::get<2>(k), " appears twice"));
    }
  }
  if (t.rows.empty()) return absl::InvalidArgumentError(StrCat(name, ": no rows"));
  return t;
}

}  // namespace

double StudentT975(int dof) {
  static const double kT[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                              2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086};
  if (dof < 1) return std::numeric_limits<double>::infinity();
  if (dof <= 20) return kT[dof - 1];
  return dof <= 30 ? 2.042 : 1.960;
}

absl::StatusOr<std::string> CombineGainRepeats(const std::vector<std::pair<std::string, std::string>>& tables,
                                               GainsRepeatsSummary* summary) {
  if (tables.size() < 2) {
    return absl::InvalidArgumentError(StrCat("combining gain repeats needs at least 2 tables, got ", tables.size()));
  }
  std::vector<Table> parsed;
  for (const auto& [name, text] : tables) {
    absl::StatusOr<Table> t = ParseTable(name, text);
    if (!t.ok()) return t.status();
    if (!parsed.empty()) {
      const Table& first = parsed.front();
      if (t->definition != first.definition || t->measure != first.measure) {
        return absl::InvalidArgumentError(StrCat(name, ": gain-definition '", t->definition, "' / gain-measure '",
                                                 t->measure, "' differ from ", tables.front().first, "'s '",
                                                 first.definition, "' / '", first.measure, "'"));
      }
      for (const auto& [k, r] : first.rows) {
        if (!t->rows.contains(k)) {
          return absl::InvalidArgumentError(StrCat(name, ": no row ", std::get<0>(k), ",", std::get<1>(k), ",",
                                                   std::get<2>(k), " (", tables.front().first, " has it)"));
        }
      }
      if (t->rows.size() != first.rows.size()) {
        return absl::InvalidArgumentError(StrCat(name, ": ", t->rows.size(), " rows, ", tables.front().first,
                                                 " has ", first.rows.size()));
      }
    }
    parsed.push_back(std::move(*t));
  }
  const int n = static_cast<int>(parsed.size());
  const double t975 = StudentT975(n - 1);
  GainsRepeatsSummary sum;
  sum.repeats = n;
  std::string out = StrCat("# gains-format: 2\n# gain-definition: ", parsed[0].definition.empty() ? "speedup" : parsed[0].definition,
                           "\n", parsed[0].measure.empty() ? "" : StrCat("# gain-measure: ", parsed[0].measure, "\n"),
                           "# repeats: ", n, " (95% interval: mean +- t sd / sqrt(n); sign: the interval's)\n",
                           "task_a,task_b,mode,gain,gain_steps,steps_censored,repeats,gain_sd,ci_low,ci_high,sign\n");
  for (const auto& [k, first] : parsed[0].rows) {
    double mean = 0, mean_steps = 0;
    int censored = 0;
    for (const Table& t : parsed) {
      const Row& r = t.rows.at(k);
      mean += r.gain / n;
      mean_steps += r.gain_steps / n;
      censored = std::max(censored, r.censored);
    }
    double ss = 0;
    for (const Table& t : parsed) ss += (t.rows.at(k).gain - mean) * (t.rows.at(k).gain - mean);
    const double sd = std::sqrt(ss / (n - 1));
    const double half = t975 * sd / std::sqrt(static_cast<double>(n));
    const double lo = mean - half, hi = mean + half;
    const char* sign = lo > 0 ? "positive" : hi < 0 ? "negative" : "neutral";
    ++sum.pairs;
    (lo > 0 ? sum.positive : hi < 0 ? sum.negative : sum.neutral) += 1;
    out += absl::StrFormat("%s,%s,%s,%.6f,%.6f,%d,%d,%.6f,%.6f,%.6f,%s\n", std::get<0>(k), std::get<1>(k),
                           std::get<2>(k), mean, mean_steps, censored, n, sd, lo, hi, sign);
  }
  if (summary != nullptr) *summary = sum;
  return out;
}

}  // namespace slicesched::ymir
