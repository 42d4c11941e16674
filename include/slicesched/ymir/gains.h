// Transfer-gain tables between fine-tuning tasks: what the Ymir planners
// (the daemon's job runner and the `slicesim ymir` simulator) pair on, and
// the loader of the gains CSV (configs/ymir/README.md, "Format").
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "slicesched/ymir/planner.h"

namespace slicesched::ymir {

// Where a loaded table's gains came from (LoadYmirGains), for reports.
struct YmirGainsSource {
  int format = 0;          // the file's gains-format (1 or 2); 0: not loaded from a file
  std::string column;      // the column the gains were read from: "gain" or "gain_steps"
  std::string definition;  // "saved" or "speedup" (the file's gain-definition)
  std::string measure;     // format 2's gain-measure ("area" or "steps"); "" when not stated
  int censored_rows = 0;   // rows read as censoring bounds (gain_steps with steps_censored = 1)
  // Rows whose `sign` column says neutral: the repeats' interval includes 0.
  int neutral_rows = 0;
  bool pair_neutral = false;  // YmirGainsLoadOptions::pair_neutral
  // One line, e.g. "gain_steps (format 2, speedup in steps to target; 6
  // censored rows: bounds, never paired)".
  std::string Describe() const;
};

// Transfer gains between tasks. Temporal gains are directed (a -> b);
// spatial gains are symmetric.
class YmirGains {
 public:
  // Adds or replaces a gain. `mode` is kTemporal or kSpatial.
  void Set(const std::string& a, const std::string& b, ymir::Mode mode, double gain);
  // The gain, or false when the table has none for that pair and mode.
  bool Get(const std::string& a, const std::string& b, ymir::Mode mode, double* gain) const;
  // Marks a pair's gain as censored: only bounded (at most the stored value),
  // because the transfer run did not reach the target within its step limit.
  // The simulator never offers a censored pair for transfer.
  void SetCensored(const std::string& a, const std::string& b, ymir::Mode mode);
  bool Censored(const std::string& a, const std::string& b, ymir::Mode mode) const;
  // Marks a pair's gain as neutral: measured with repeats whose interval
  // includes 0, so not even its sign is established (the mean is noise).
  void SetNeutral(const std::string& a, const std::string& b, ymir::Mode mode);
  bool Neutral(const std::string& a, const std::string& b, ymir::Mode mode) const;
  // A gain a planner may act on: in the table, not censored (a censored
  // gain is only a bound) and not neutral (pairing on a gain that the
  // repeats cannot tell from 0 costs the temporal target its wait for
  // nothing measurable). The simulator's and the daemon's planners both
  // pair through this.
  bool Plannable(const std::string& a, const std::string& b, ymir::Mode mode, double* gain) const {
    return Get(a, b, mode, gain) && !Censored(a, b, mode) && !Neutral(a, b, mode);
  }
  const YmirGainsSource& source() const { return source_; }
  void set_source(YmirGainsSource source) { source_ = std::move(source); }
  // Every task named in the table (plus those added with AddTask), sorted.
  std::vector<std::string> Tasks() const;
  void AddTask(const std::string& task);
  size_t size() const { return gains_.size(); }
  // Every task T of this table becomes "<bb>/T" for each backbone bb, with the
  // same gains inside each backbone (a measured single-backbone family reused
  // per backbone); tasks already naming a backbone ("x/y") are kept as is.
  YmirGains WithBackbones(const std::vector<std::string>& backbones) const;

 private:
  std::map<std::tuple<std::string, std::string, int>, double> gains_;
  std::set<std::tuple<std::string, std::string, int>> censored_;
  std::set<std::tuple<std::string, std::string, int>> neutral_;
  std::map<std::string, int> tasks_;
  YmirGainsSource source_;
};

// The "<backbone>" part of "<backbone>/<task>" (the whole name without '/').
std::string YmirBackbone(const std::string& task);

// The documented stand-in table (see the header comment).
YmirGains DefaultYmirGains();

// What the `gain` column of a gains CSV means.
enum class YmirGainsDefinition {
  // The fraction of iterations saved, g: the target needs (1 - g) times its
  // iterations (temporal A -> B: B's; spatial: the pair's joint iterations).
  // This is what YmirGains stores and the simulator uses. g < 1.
  kSaved,
  // The estimators' definition (experiments/task2vec.h, GainsCsv):
  //   gain(B | mode, A) = steps(normal B) / steps(transfer B) - 1  (> -1),
  // i.e. B's speedup in steps minus one (format 2's gain_steps; its `gain`
  // column, and a format-1 file's, may be the area-equivalent speed-up
  // instead, the same kind of number over a different measure). Converted
  // on load:
  //   temporal A -> B:  saved = 1 - 1 / (1 + gain)  = gain / (1 + gain);
  //   spatial A + B:    the rows (A,B) (B's gain) and (B,A) (A's gain) are
  //                     merged into one symmetric value: with equal work,
  //                     joint iterations = (N_A / r_A + N_B / r_B) where
  //                     r = 1 + gain, so saved = 1 - mean over the given
  //                     rows of 1 / (1 + gain). One row alone gives
  //                     1 - 1 / (1 + gain).
  kSpeedup,
};

// Loads a gains table (configs/ymir/README.md, "Format"): CSV with header
// task_a,task_b,mode,gain (any order, other columns ignored); mode is
// "temporal" or "spatial". Lines starting with '#' are comments; these
// directives, before the header, are read:
//   "# gains-format: 1|2"           (absent: 1);
//   "# gain-definition: speedup|saved" (absent: saved in format 1, speedup
//                                     in format 2, which allows no other);
//   "# gain-measure: area|steps"     (what `gain` is; with "steps" it must
//                                     equal gain_steps on every row).
// Format 2 (`slicesim ymir-estimators --gains-out`) adds the columns
// gain_steps (steps(normal B) / steps(transfer B) - 1, a speedup) and
// steps_censored (0 or 1; 1: a transfer run did not reach the target, so
// gain_steps is an upper bound) and is read from gain_steps by default: the
// simulator's work is steps to target. A censored row keeps its bound (the
// least slowdown it shows) and is flagged (YmirGains::Censored). Format 1
// has one gain column, read as it is. Errors name "<path>:<line>" and the
// bad field or the contradiction (kSaved: gain must be finite and < 1;
// kSpeedup: finite and > -1; a repeated row is an error, except that
// kSpeedup takes both (A,B) and (B,A) spatial rows; format-2 columns in a
// format-1 file; a format-2 file without them).
// An optional `sign` column (positive, negative or neutral; `slicesim
// ymir-gains --combine` writes it from the repeats' 95% interval) marks the
// neutral rows (YmirGains::Neutral; a spatial pair is neutral when each of
// its rows is); any other value is an error naming it.
struct YmirGainsLoadOptions {
  // Forced definition (the file's directive, if any, must agree); unset: the file's.
  std::optional<YmirGainsDefinition> definition;
  // "" = gain_steps in format 2, gain in format 1; "gain" or "gain_steps"
  // (format 2 only) to choose.
  std::string column;
  // True: neutral rows are paired on their point estimates, as a table
  // without a sign column is (counted in YmirGainsSource::neutral_rows all
  // the same).
  bool pair_neutral = false;
};
absl::StatusOr<YmirGains> LoadYmirGains(const std::string& path, const YmirGainsLoadOptions& options = {});

}  // namespace slicesched::ymir
