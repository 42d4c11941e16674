// The built-in synthetic tasks: one synthetic language and a family
// of small tasks over it whose relatedness is controlled, so that transfer
// between tasks (Ymir's temporal / spatial modes, ../shared/papers/ymir.md)
// can be positive, neutral or negative by construction. These are the names
// a job YAML's `dataset: {synthetic: {task: NAME, seed: N}}` accepts.
//
// Language. `classes` latent word classes partition the vocabulary (a seeded
// permutation: token t belongs to class perm[t] % classes). A sentence is a
// first-order Markov chain over classes (uniform start; each class's row of
// the transition matrix has seeded weights exp(1.5 z), z ~ N(0, 1)), and each
// position emits a token of its class with Zipf weights 1/(rank+1) over the
// class's members in a seeded order. Everything about the language comes from
// LanguageOptions::seed; a dataset's own `seed` only picks its sentences, so
// every task of one language shares the same inputs distribution.
//
// Tasks. Classification tasks are labelled at the sequence level (the
// training code puts the label on the last position, see train_ops.h);
// next-token tasks have no label (written as 0) and train on every position.
// The classification tasks read a latent feature of the sentence, the count
// c_S(x) of its tokens whose class lies in a class set S:
//
//   family  S        variants (NAME = FAMILY-VARIANT)
//   fa      {0, 1}   major:  1 if c_S >= t_S (t_S: the median threshold of
//   fb      {2, 3}           the language at this length, so ~balanced)
//   fab     {1, 2}   inv:    1 - major (the same feature, labels inverted)
//                    noisy:  major with 20% of labels flipped (seeded)
//                    bins:   c_S cut at the language's quantiles into
//                            num_classes balanced classes
//                    rev:    bins with the label map reversed (C-1-j)
//                    split:  c_{s0} - c_{s1} (S = {s0, s1}: the difference
//                            of the set's two classes' counts) in
//                            num_classes quantile bins
//
// plus
//   parity      c_{0,1}(x) mod 2 (the fa feature, but hard to learn)
//   last-class  the class of the last token mod num_classes (a local feature
//               unrelated to the counts)
//   first-class the class of the FIRST token mod num_classes (a local
//               feature too, but read at the last position it needs the
//               attention concentrated on position 0; see "attention
//               conflict" below)
//   lm          next-token prediction on the language
//   copy        next-token prediction on sentences whose second half repeats
//               the first half
//
// Data salt. NAME@K (K = 1..999999) is task NAME on other sentences: the
// same rule (thresholds, label map), the sentences drawn from seed ^ (K x
// golden-ratio constant) instead of seed. Two tasks that differ only in the
// salt are the "identical rule" end of the graded family below.
//
// Label strength (DatasetOptions::margin). With the
// plain quantile labels, adjacent classes of a count feature are one token
// apart, so most examples sit next to a class boundary and the tiny
// backbone's LoRA learns them slowly: the binary tasks at length 8 got only
// 0.02-0.13 nats below chance in 40 steps, about the eval loss's wander
// (docs/design/ymir-estimators.md). With margin m > 0 the label is
// drawn first (uniformly: balanced classes) and then sentences of the
// language until one's feature lies in that label's bin and not among the m
// values just below a threshold; the thresholds are placed at least m + 1
// apart (and the first above m), so every class keeps values and adjacent
// classes are at least m + 1 counts apart. The sentences are still the
// language's (a rejection sample of it), only which ones a task keeps
// changes. With m = 1, 16 tokens, C = 4 and a 32-token language the count
// tasks end at 0.36-0.56 x ln 4 after 80 steps
// (docs/design/ymir-estimators.md).
//
// Graded relatedness, by construction (what was measured is in
// docs/design/ymir-estimators.md). For transfer between tasks with
// their own heads only the feature matters (the head is never transferred),
// so the levels are levels of shared FEATURES:
//   identical rule    X and X@K: the same rule on other sentences.
//   same feature,     fa-bins and fa-rev: a relabelling. Under a zero head
//   other label map   (task2vec.h) a permutation of the labels is a symmetry
//                     of the probe, so for a fresh zero head this level is
//                     the identical-rule level; with a random head it is not.
//   partly shared     fab (S = {1, 2}) shares one class with fa ({0, 1}) and
//                     one with fb ({2, 3}).
//   disjoint          fa, fb: disjoint class sets (and last-class, a local
//                     feature read without attention).
//   conflicting       fa-bins and fa-split read the same two classes, but
//                     fa-bins needs them counted alike (c_0 + c_1) and
//                     fa-split needs them opposite (c_0 - c_1): what A's
//                     adapter learns to merge, B has to tell apart. (A fresh
//                     head reads either sum; measured near neutral.)
//   attention         first-class against a count task (fa-bins, fb-bins):
//   conflict          the same sentences, but the count tasks need the last
//                     position to attend over the whole sentence, and
//                     first-class needs it on one token (position 0). The
//                     adapters sit on q and v (train_ops.h): A's q adapter
//                     sets where the last position attends, which B's fresh
//                     head cannot undo: B must first unlearn A's attention.
//                     Measured (docs/design/ymir-estimators.md):
//                     first-class -> count task (temporal) is negative on
//                     every seed and pair (-0.13 .. -0.54, area gain), the
//                     family's negative level. The other direction is
//                     positive over a 40-step window (first-class alone
//                     sits on a plateau until its LoRA moves, and any
//                     trained adapter ends it) and near neutral over the
//                     whole 80-step run.
// Without the margin (task2vec.h's first setup: binary tasks at length 8
// over the 256-token language): same-feature pairs came out
// negative with a random head and positive with a zero head, and the
// measured gains changed sign between seeds because the tasks were barely
// learnt below chance; that is why the margin and the family above exist.
// Under a zero head `inv` is the mirror image of `major` (label inversion
// is a symmetry of the zero head and the LoRA init), so the two give
// identical curves.
//
// Binary tasks (major, inv, noisy, parity) require num_classes == 2; bins,
// rev, split, last-class and first-class accept any num_classes >= 2
// (last-class and first-class at most `classes`).
//
// Determinism: a seeded SplitMix64 generator and integer/double arithmetic
// only, so the same options give the same examples on every platform.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace slicesched::synth {

struct LanguageOptions {
  int64_t vocab = 256;  // token ids 0..vocab-1 (the tiny preset's vocabulary)
  int64_t classes = 8;  // latent word classes, 4..vocab
  uint64_t seed = 2026;
  absl::Status Validate() const;
};

// A deterministic generator: SplitMix64.
class Rng {
 public:
  explicit Rng(uint64_t seed) : x_(seed) {}
  uint64_t Next();
  double Uniform();                                    // [0, 1), 53 bits
  int64_t Below(int64_t n);                            // [0, n), n >= 1
  double Normal();                                     // Box-Muller
  size_t Pick(const std::vector<double>& cumulative);  // index by cumulative weights

 private:
  uint64_t x_;
};

class Language {
 public:
  static absl::StatusOr<Language> Make(const LanguageOptions& options);

  const LanguageOptions& options() const { return options_; }
  int64_t ClassOf(int64_t token) const { return token_class_[static_cast<size_t>(token)]; }
  // A sentence of `length` tokens.
  std::vector<int64_t> Sample(int64_t length, Rng& rng) const;

 private:
  LanguageOptions options_;
  std::vector<int64_t> token_class_;
  std::vector<std::vector<int64_t>> members_;         // per class, in emission order
  std::vector<std::vector<double>> emit_cumulative_;  // per class
  std::vector<std::vector<double>> next_cumulative_;  // per class: over next classes
};

enum class TaskKind : uint8_t { kClassification, kNextToken };

struct TaskInfo {
  std::string name;
  std::string family;  // fa, fb, fab, parity, last-class, first-class, lm, copy
  TaskKind kind = TaskKind::kClassification;
  std::string description;
};

// Every task name, in a fixed order (without data salts).
const std::vector<TaskInfo>& KnownTasks();

// A task name may carry a data salt, NAME@K (K: 1 to 6 decimal digits): the
// same rule as NAME on other sentences (K = 0 is NAME itself).
struct TaskName {
  std::string base;
  uint64_t salt = 0;
};
// InvalidArgument naming `name` for a malformed salt.
absl::StatusOr<TaskName> ParseTaskName(std::string_view name);
// NotFound naming `name` and listing the known names (a name with a data
// salt finds its base task; the returned name keeps the salt).
absl::StatusOr<TaskInfo> FindTask(std::string_view name);

struct Example {
  std::vector<int64_t> tokens;
  int64_t label = 0;  // the class; 0 for next-token tasks
};

struct DatasetOptions {
  std::string task;
  uint64_t seed = 0;
  int64_t examples = 1024;
  int64_t sequence_length = 32;
  int64_t num_classes = 2;
  // Count-family tasks (fa, fb, fab variants): > 0 draws the label first
  // (uniformly) and then sentences of the language until one's feature lies
  // in that label's bin and not among the `margin` values just below any
  // threshold, so adjacent classes are at least margin + 1 counts apart
  // (see "Label strength" above). 0 = label every sentence as drawn.
  int64_t margin = 0;
  LanguageOptions language;
  // InvalidArgument naming the option and its value: a known task, examples
  // >= 1, sequence_length >= 2, num_classes >= 2 (2 for binary tasks, at
  // most language.classes for last-class and first-class), a valid
  // language. Generate checks it first.
  absl::Status Validate() const;
};

// The examples of a task. InvalidArgument for an unknown task, non-positive
// sizes, a sequence_length < 2, or num_classes the task does not accept.
absl::StatusOr<std::vector<Example>> Generate(const DatasetOptions& options);

// The documented file formats (docs/operations.md, "Fine-tuning jobs"):
// jsonl: {"tokens": [...], "label": N} per line; tokens-bin: "SSTOKV1\n",
// u64 count, then per example i64 label, u32 length, u32 tokens (all
// little-endian).
absl::Status WriteJsonl(const std::string& path, const std::vector<Example>& examples);
absl::Status WriteTokensBin(const std::string& path, const std::vector<Example>& examples);
// Reads a tokens-bin file back (for tests and tools).
absl::StatusOr<std::vector<Example>> ReadTokensBin(const std::string& path);
// Parses line `lineno` of the jsonl file `path`: {"tokens": [...], "label":
// N}, tokens integers (range-checked against the vocabulary by the caller),
// the label optional (0), a number within +-2^53, truncated to an integer.
// Errors: InvalidArgument "PATH:LINE: what is wrong".
absl::Status ParseJsonlExample(std::string_view line, size_t lineno, const std::string& path, Example* out);

}  // namespace slicesched::synth
