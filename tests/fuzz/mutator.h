// A seeded, deterministic input mutator for the input-robustness tests
// (tests/fuzz/): byte-level mutations (bit flips, random bytes, insertions,
// deletions, truncation, duplicated ranges, non-UTF-8 and NUL bytes) and
// structure-aware ones on line-oriented text (YAML, CSV, JSONL): deleting,
// duplicating and swapping lines, swapping the values of two `key: value`
// lines, replacing a value with an extreme one (-1, 0, 2^31, 2^63, NaN,
// 1e308, a 64 KiB string, 4000-deep nesting, ...), renaming a key, shifting
// indentation. Each Mutate() applies 1..3 mutations; the same seed always
// gives the same sequence of outputs.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace slicesched::fuzz {

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  // A mutated copy of `input`.
  std::string Mutate(std::string_view input);

  // The extreme values a structure-aware mutation substitutes (exposed so the
  // RPC test can draw numbers and strings from the same dictionary).
  static const std::vector<std::string>& ExtremeValues();
  static const std::vector<int64_t>& ExtremeIntegers();

  // Uniform in [0, n); n > 0.
  size_t Below(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  // Draws from ExtremeIntegers().
  int64_t ExtremeInteger();
  // A random string: an extreme value, random bytes, or a long run.
  std::string OddString();

 private:
  void MutateOnce(std::string& s);
  void ByteMutation(std::string& s);
  void LineMutation(std::string& s);
  void ValueMutation(std::string& s);

  std::mt19937_64 rng_;
};

}  // namespace slicesched::fuzz
