#include "slicesched/synth/tasks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numbers>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

namespace slicesched::synth {
namespace {

// Sentences drawn to place the thresholds of the count features.
constexpr int64_t kThresholdSamples = 4096;
constexpr uint64_t kThresholdSalt = 0x7468726573686f6cull;  // "threshol"
constexpr double kNoisyFlip = 0.2;

std::vector<double> Cumulative(const std::vector<double>& w) {
  std::vector<double> c(w.size());
  double sum = 0;
  for (size_t i = 0; i < w.size(); ++i) c[i] = (sum += w[i]);
  for (double& x : c) x /= sum;
  return c;
}

const std::vector<int64_t>* ClassSet(const std::string& family) {
  static const std::vector<int64_t> fa = {0, 1}, fb = {2, 3}, fab = {1, 2};
  if (family == "fa" || family == "parity") return &fa;
  if (family == "fb") return &fb;
  if (family == "fab") return &fab;
  return nullptr;
}

int64_t Count(const Language& lang, const std::vector<int64_t>& tokens, const std::vector<int64_t>& set) {
  int64_t c = 0;
  for (int64_t t : tokens) c += std::find(set.begin(), set.end(), lang.ClassOf(t)) != set.end() ? 1 : 0;
  return c;
}

// The sequence-level feature a count-family task reads (tasks.h): c_S for
// every variant but `split`, whose feature is c_{s0} - c_{s1} + length (the
// difference of the set's two classes' counts, shifted to be >= 0). Range
// 0..2 length.
int64_t Feature(const Language& lang, const std::vector<int64_t>& tokens, const std::vector<int64_t>& set,
                bool split) {
  if (!split) return Count(lang, tokens, set);
  const std::vector<int64_t> first = {set[0]}, second = {set[1]};
  return Count(lang, tokens, first) - Count(lang, tokens, second) + static_cast<int64_t>(tokens.size());
}

// Thresholds t_1 < ... < t_{k-1} on the feature so that class j = #{t_i <= f}
// has about 1/k of the language's sentences: t_i is the smallest value whose
// cumulative share reaches i/k (at least 1 above the previous threshold).
std::vector<int64_t> Thresholds(const Language& lang, const std::vector<int64_t>& set, int64_t length, int64_t k,
                                bool split, int64_t margin) {
  Rng rng(lang.options().seed ^ kThresholdSalt ^ static_cast<uint64_t>(length) ^ (split ? 0x73706c6974ull : 0));
  const int64_t top = 2 * length;
  std::vector<int64_t> hist(static_cast<size_t>(top + 1), 0);
  for (int64_t i = 0; i < kThresholdSamples; ++i)
    ++hist[static_cast<size_t>(Feature(lang, lang.Sample(length, rng), set, split))];
  std::vector<int64_t> out;
  int64_t below = 0;  // sentences with feature < c
  int64_t c = 0;
  for (int64_t i = 1; i < k; ++i) {
    const double want = static_cast<double>(kThresholdSamples) * static_cast<double>(i) / static_cast<double>(k);
    // With a margin every class keeps at least one value outside the dead
    // zone: thresholds at least margin + 1 apart (and above margin).
    int64_t lo = out.empty() ? 1 + margin : out.back() + 1 + margin;
    while (c < lo) below += hist[static_cast<size_t>(c++)];
    // Move up while stopping here leaves the lower classes short by more than
    // taking the next value would overshoot.
    while (c <= top && static_cast<double>(below) + static_cast<double>(hist[static_cast<size_t>(c)]) / 2.0 < want) {
      below += hist[static_cast<size_t>(c++)];
    }
    out.push_back(std::min(c, top));
  }
  return out;
}

int64_t Bin(int64_t count, const std::vector<int64_t>& thresholds) {
  int64_t j = 0;
  for (int64_t t : thresholds) j += count >= t ? 1 : 0;
  return j;
}

}  // namespace

absl::StatusOr<TaskName> ParseTaskName(std::string_view name) {
  TaskName out;
  const size_t at = name.find('@');
  out.base = std::string(name.substr(0, at));
  if (at == std::string_view::npos) return out;
  const std::string_view digits = name.substr(at + 1);
  uint64_t salt = 0;
  bool ok = !digits.empty() && digits.size() <= 6;
  for (char ch : digits) {
    ok = ok && ch >= '0' && ch <= '9';
    salt = salt * 10 + static_cast<uint64_t>(ch - '0');
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        StrCat("task '", name, "': the data salt after '@' must be 1 to 6 decimal digits"));
  }
  out.salt = salt;
  return out;
}

absl::Status LanguageOptions::Validate() const {
  if (vocab < 8) return absl::InvalidArgumentError(StrCat("language vocab must be at least 8, got ", vocab));
  if (classes < 4 || classes > vocab) {
    return absl::InvalidArgumentError(StrCat("language classes must be in [4, vocab=", vocab, "], got ", classes));
  }
  return absl::OkStatus();
}

uint64_t Rng::Next() {
  uint64_t z = (x_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Rng::Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

int64_t Rng::Below(int64_t n) { return static_cast<int64_t>(Next() % static_cast<uint64_t>(n)); }

double Rng::Normal() {
  const double u1 = 1.0 - Uniform();  // (0, 1]
  const double u2 = Uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

size_t Rng::Pick(const std::vector<double>& cumulative) {
  const double u = Uniform();
  const auto it = std::upper_bound(cumulative.begin(), cumulative.end(), u);
  return std::min(static_cast<size_t>(it - cumulative.begin()), cumulative.size() - 1);
}

absl::StatusOr<Language> Language::Make(const LanguageOptions& options) {
  SLICESCHED_RETURN_IF_ERROR(options.Validate());
  Language l;
  l.options_ = options;
  Rng rng(options.seed);
  const auto v = static_cast<size_t>(options.vocab);
  const auto k = static_cast<size_t>(options.classes);
  std::vector<int64_t> perm(v);
  for (size_t i = 0; i < v; ++i) perm[i] = static_cast<int64_t>(i);
  for (size_t i = v - 1; i > 0; --i)
    std::swap(perm[i], perm[static_cast<size_t>(rng.Below(static_cast<int64_t>(i) + 1))]);
  l.token_class_.resize(v);
  l.members_.resize(k);
  for (size_t t = 0; t < v; ++t) {
    l.token_class_[t] = perm[t] % options.classes;
    l.members_[static_cast<size_t>(l.token_class_[t])].push_back(static_cast<int64_t>(t));
  }
  for (size_t c = 0; c < k; ++c) {
    auto& m = l.members_[c];
    for (size_t i = m.size() - 1; i > 0; --i)
      std::swap(m[i], m[static_cast<size_t>(rng.Below(static_cast<int64_t>(i) + 1))]);
    std::vector<double> w(m.size());
    for (size_t r = 0; r < m.size(); ++r) w[r] = 1.0 / static_cast<double>(r + 1);
    l.emit_cumulative_.push_back(Cumulative(w));
    std::vector<double> next(k);
    for (double& x : next) x = std::exp(1.5 * rng.Normal());
    l.next_cumulative_.push_back(Cumulative(next));
  }
  return l;
}

std::vector<int64_t> Language::Sample(int64_t length, Rng& rng) const {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(length, 0)));
  size_t c = static_cast<size_t>(rng.Below(options_.classes));
  for (int64_t i = 0; i < length; ++i) {
    if (i > 0) c = rng.Pick(next_cumulative_[c]);
    out.push_back(members_[c][rng.Pick(emit_cumulative_[c])]);
  }
  return out;
}

const std::vector<TaskInfo>& KnownTasks() {
  static const std::vector<TaskInfo> tasks = [] {
    std::vector<TaskInfo> t;
    for (const char* fam : {"fa", "fb", "fab"}) {
      const std::string f = fam;
      const std::string feat = StrCat("the count of tokens of the ", f, " class set");
      t.push_back({f + "-major", f, TaskKind::kClassification, StrCat("1 if ", feat, " is at least its median")});
      t.push_back({f + "-inv", f, TaskKind::kClassification, StrCat(f, "-major with inverted labels")});
      t.push_back({f + "-noisy", f, TaskKind::kClassification, StrCat(f, "-major with 20% of labels flipped")});
      t.push_back({f + "-bins", f, TaskKind::kClassification, StrCat(feat, " in num_classes quantile bins")});
      t.push_back({f + "-rev", f, TaskKind::kClassification,
                   StrCat(f, "-bins with the label map reversed (class C-1-j for bin j)")});
      t.push_back({f + "-split", f, TaskKind::kClassification,
                   StrCat("the count of the ", f, " set's first class minus its second's, in num_classes quantile bins")});
    }
    t.push_back({"parity", "parity", TaskKind::kClassification, "the count of the fa class set mod 2"});
    t.push_back({"last-class", "last-class", TaskKind::kClassification, "the class of the last token mod num_classes"});
    t.push_back({"first-class", "first-class", TaskKind::kClassification,
                 "the class of the first token mod num_classes (read at the last position: attention to one place)"});
    t.push_back({"lm", "lm", TaskKind::kNextToken, "next-token prediction on the language"});
    t.push_back({"copy", "copy", TaskKind::kNextToken, "next-token prediction; the second half repeats the first"});
    return t;
  }();
  return tasks;
}

absl::StatusOr<TaskInfo> FindTask(std::string_view name) {
  SLICESCHED_ASSIGN_OR_RETURN(TaskName parsed, ParseTaskName(name));
  std::string names;
  for (const TaskInfo& t : KnownTasks()) {
    if (t.name == parsed.base) {
      TaskInfo info = t;
      info.name = std::string(name);
      return info;
    }
    names += names.empty() ? t.name : ", " + t.name;
  }
  return absl::NotFoundError(StrCat("unknown synthetic task '", name, "' (known: ", names, ")"));
}

absl::Status DatasetOptions::Validate() const {
  auto info = FindTask(task);
  if (!info.ok()) return absl::InvalidArgumentError(info.status().message());
  SLICESCHED_ASSIGN_OR_RETURN(const TaskName parsed, ParseTaskName(task));
  if (examples < 1) return absl::InvalidArgumentError(StrCat("examples must be at least 1, got ", examples));
  if (sequence_length < 2) {
    return absl::InvalidArgumentError(StrCat("sequence_length must be at least 2, got ", sequence_length));
  }
  if (num_classes < 2) return absl::InvalidArgumentError(StrCat("num_classes must be at least 2, got ", num_classes));
  SLICESCHED_RETURN_IF_ERROR(language.Validate());
  const std::string& fam = info->family;
  const std::string variant = parsed.base.substr(std::min(parsed.base.size(), fam.size() + 1));
  const bool binary = fam == "parity" || variant == "major" || variant == "inv" || variant == "noisy";
  if (binary && num_classes != 2) {
    return absl::InvalidArgumentError(StrCat("task '", task, "' is binary: num_classes must be 2, got ", num_classes));
  }
  if ((fam == "last-class" || fam == "first-class") && num_classes > language.classes) {
    return absl::InvalidArgumentError(StrCat("task '", fam, "': num_classes must be at most the language's ",
                                             language.classes, " classes, got ", num_classes));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Example>> Generate(const DatasetOptions& o) {
  SLICESCHED_RETURN_IF_ERROR(o.Validate());
  SLICESCHED_ASSIGN_OR_RETURN(const TaskInfo info, FindTask(o.task));
  SLICESCHED_ASSIGN_OR_RETURN(const TaskName parsed, ParseTaskName(o.task));
  SLICESCHED_ASSIGN_OR_RETURN(Language lang, Language::Make(o.language));
  const std::string& fam = info.family;
  const std::string variant = parsed.base.substr(std::min(parsed.base.size(), fam.size() + 1));
  const bool split = variant == "split";
  const std::vector<int64_t>* set = ClassSet(fam);
  std::vector<int64_t> thresholds;
  if (set != nullptr && fam != "parity") {
    const bool multi = variant == "bins" || variant == "rev" || split;
    thresholds = Thresholds(lang, *set, o.sequence_length, multi ? o.num_classes : 2, split,
                            fam == "parity" ? 0 : std::max<int64_t>(o.margin, 0));
  }
  // A data salt K (NAME@K) draws other sentences for the same rule.
  const uint64_t data_seed = parsed.salt == 0 ? o.seed : o.seed ^ (parsed.salt * 0x9e3779b97f4a7c15ull);
  Rng rng(data_seed);
  Rng noise(data_seed ^ 0x6e6f697365ull);  // "noise": independent of the sentences
  std::vector<Example> out;
  out.reserve(static_cast<size_t>(o.examples));
  if (o.margin < 0) return absl::InvalidArgumentError(StrCat("margin must be >= 0, got ", o.margin));
  const bool margin = o.margin > 0 && set != nullptr && fam != "parity";
  auto in_dead_zone = [&](int64_t f) {
    for (int64_t t : thresholds) {
      if (f >= t - o.margin && f < t) return true;
    }
    return false;
  };
  for (int64_t i = 0; i < o.examples; ++i) {
    Example e;
    if (margin) {
      // Label first, then a sentence of the language whose feature lies in
      // that bin, outside the dead zone below every threshold (tasks.h).
      const int64_t want = rng.Below(static_cast<int64_t>(thresholds.size()) + 1);
      constexpr int64_t kTries = 200000;
      int64_t tries = 0;
      for (; tries < kTries; ++tries) {
        e.tokens = lang.Sample(o.sequence_length, rng);
        const int64_t f = Feature(lang, e.tokens, *set, split);
        if (Bin(f, thresholds) == want && !in_dead_zone(f)) break;
      }
      if (tries == kTries) {
        return absl::InvalidArgumentError(StrCat("task '", o.task, "': no sentence of length ", o.sequence_length,
                                                 " in ", kTries, " draws has class ", want, " with margin ",
                                                 o.margin, " (use a smaller margin or fewer classes)"));
      }
    } else if (fam == "copy") {
      const int64_t half = (o.sequence_length + 1) / 2;
      e.tokens = lang.Sample(half, rng);
      for (int64_t j = half; j < o.sequence_length; ++j) e.tokens.push_back(e.tokens[static_cast<size_t>(j - half)]);
    } else {
      e.tokens = lang.Sample(o.sequence_length, rng);
    }
    if (fam == "parity") {
      e.label = Count(lang, e.tokens, *set) % 2;
    } else if (fam == "last-class") {
      e.label = lang.ClassOf(e.tokens.back()) % o.num_classes;
    } else if (fam == "first-class") {
      e.label = lang.ClassOf(e.tokens.front()) % o.num_classes;
    } else if (set != nullptr) {
      e.label = Bin(Feature(lang, e.tokens, *set, split), thresholds);
      if (variant == "inv") e.label = 1 - e.label;
      if (variant == "rev") e.label = o.num_classes - 1 - e.label;
      if (variant == "noisy" && noise.Uniform() < kNoisyFlip) e.label = 1 - e.label;
    }
    out.push_back(std::move(e));
  }
  return out;
}

absl::Status WriteJsonl(const std::string& path, const std::vector<Example>& examples) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return absl::UnavailableError(StrCat("cannot open '", path, "' for writing"));
  for (const Example& e : examples) {
    f << "{\"tokens\": [";
    for (size_t i = 0; i < e.tokens.size(); ++i) f << (i ? ", " : "") << e.tokens[i];
    f << "], \"label\": " << e.label << "}\n";
  }
  f.flush();
  if (!f) return absl::DataLossError(StrCat("writing '", path, "' failed"));
  return absl::OkStatus();
}

namespace {
template <typename T>
void PutLe(std::string& out, T v) {
  const auto u = static_cast<uint64_t>(v);
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}
template <typename T>
bool GetLe(const std::string& in, size_t& pos, T* v) {
  if (pos + sizeof(T) > in.size()) return false;
  uint64_t u = 0;
  for (size_t i = 0; i < sizeof(T); ++i) u |= static_cast<uint64_t>(static_cast<unsigned char>(in[pos + i])) << (8 * i);
  pos += sizeof(T);
  *v = static_cast<T>(u);
  return true;
}
constexpr std::string_view kMagic = "SSTOKV1\n";
}  // namespace

absl::Status WriteTokensBin(const std::string& path, const std::vector<Example>& examples) {
  std::string out(kMagic);
  PutLe<uint64_t>(out, examples.size());
  for (const Example& e : examples) {
    PutLe<int64_t>(out, e.label);
    PutLe<uint32_t>(out, static_cast<uint32_t>(e.tokens.size()));
    for (int64_t t : e.tokens) PutLe<uint32_t>(out, static_cast<uint32_t>(t));
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return absl::UnavailableError(StrCat("cannot open '", path, "' for writing"));
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  f.flush();
  if (!f) return absl::DataLossError(StrCat("writing '", path, "' failed"));
  return absl::OkStatus();
}

absl::Status ParseJsonlExample(std::string_view line, size_t lineno, const std::string& path, Example* out) {
  auto err = [&](const std::string& what) {
    return absl::InvalidArgumentError(StrCat(path, ":", lineno, ": ", what));
  };
  const size_t tk = line.find("\"tokens\"");
  if (tk == std::string_view::npos) return err("no \"tokens\" list");
  const size_t open = line.find('[', tk);
  const size_t close = open == std::string_view::npos ? std::string_view::npos : line.find(']', open);
  if (close == std::string_view::npos) return err("\"tokens\" is not a list");
  out->tokens.clear();
  for (absl::string_view part : absl::StrSplit(ToAbsl(line.substr(open + 1, close - open - 1)), ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (part.empty()) continue;
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v)) return err(StrCat("token '", part, "' is not an integer"));
    out->tokens.push_back(v);
  }
  if (out->tokens.empty()) return err("\"tokens\" is empty");
  out->label = 0;
  const size_t lb = line.find("\"label\"");
  if (lb != std::string_view::npos) {
    const size_t colon = line.find(':', lb);
    const size_t end = colon == std::string_view::npos ? colon : line.find_first_of(",}", colon);
    double v = 0;
    if (colon == std::string_view::npos ||
        !absl::SimpleAtod(absl::StripAsciiWhitespace(ToAbsl(line.substr(colon + 1, end - colon - 1))), &v)) {
      return err("\"label\" is not a number");
    }
    // Beyond 2^53 (or NaN) the conversion to int64 is meaningless or undefined.
    constexpr double kMaxLabel = 9007199254740992.0;
    if (!(std::abs(v) <= kMaxLabel)) return err(StrCat("\"label\" ", v, " is out of range (at most 2^53 in magnitude)"));
    out->label = static_cast<int64_t>(v);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Example>> ReadTokensBin(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(StrCat("cannot open '", path, "'"));
  const std::string in((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (in.compare(0, kMagic.size(), kMagic) != 0) {
    return absl::InvalidArgumentError(StrCat("'", path, "' does not start with the tokens-bin magic"));
  }
  size_t pos = kMagic.size();
  uint64_t n = 0;
  if (!GetLe(in, pos, &n)) return absl::InvalidArgumentError(StrCat("'", path, "': truncated count"));
  std::vector<Example> out;
  for (uint64_t i = 0; i < n; ++i) {
    Example e;
    uint32_t len = 0;
    if (!GetLe(in, pos, &e.label) || !GetLe(in, pos, &len)) {
      return absl::InvalidArgumentError(StrCat("'", path, "': example ", i, " is truncated"));
    }
    for (uint32_t j = 0; j < len; ++j) {
      uint32_t t = 0;
      if (!GetLe(in, pos, &t)) return absl::InvalidArgumentError(StrCat("'", path, "': example ", i, " is truncated"));
      e.tokens.push_back(t);
    }
    out.push_back(std::move(e));
  }
  if (pos != in.size())
    return absl::InvalidArgumentError(StrCat("'", path, "': trailing bytes after ", n, " examples"));
  return out;
}

}  // namespace slicesched::synth
