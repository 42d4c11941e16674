#include "slicesched/synth/wordnet.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

namespace slicesched::synth {
namespace {

// lexnames(5WN): the noun lexicographer files the family uses.
const std::vector<std::pair<std::string, int>>& LexFiles() {
  static const auto* files = new std::vector<std::pair<std::string, int>>{
      {"act", 4},      {"animal", 5},  {"artifact", 6}, {"body", 8},      {"cognition", 9},
      {"communication", 10}, {"food", 13}, {"group", 14}, {"location", 15}, {"object", 17},
      {"person", 18},  {"plant", 20},  {"state", 26},   {"substance", 27}};
  return *files;
}

// Hypernym subtrees, by the offset of their root synset in WordNet 3.0.
const std::vector<std::pair<std::string, uint32_t>>& Subtrees() {
  static const auto* roots = new std::vector<std::pair<std::string, uint32_t>>{
      {"mammal", 1861778},   {"bird", 1503061},      {"fish", 2512053},     {"insect", 2159955},
      {"reptile", 1661091},  {"tree", 13104059},     {"flower", 11669921},  {"shrub", 13112664},
      {"device", 3183080},   {"structure", 4341686}, {"vehicle", 4524313},  {"clothing", 3051540},
      {"weapon", 4565375},   {"fruit", 7705931},     {"beverage", 7881800}, {"dish", 7557434}};
  return *roots;
}

// SplitMix64, as the synthetic family uses.
uint64_t Mix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<std::string> GlossWords(std::string_view gloss) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : gloss) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c)) {
      cur.push_back(static_cast<char>(std::tolower(c)));
    } else if (!cur.empty()) {
      out.push_back(std::move(cur));
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

absl::Status ParseSynsetLine(absl::string_view line, const std::string& where, WordNetSynset* out) {
  const size_t bar = line.find(" | ");
  if (bar == absl::string_view::npos) return absl::InvalidArgumentError(StrCat(where, ": no ' | ' before the gloss"));
  std::vector<absl::string_view> f = absl::StrSplit(line.substr(0, bar), ' ', absl::SkipEmpty());
  auto bad = [&](absl::string_view what) { return absl::InvalidArgumentError(StrCat(where, ": ", what)); };
  if (f.size() < 4) return bad("fewer than 4 fields before the gloss");
  uint32_t offset = 0, lexfile = 0, words = 0, pointers = 0;
  if (!absl::SimpleAtoi(f[0], &offset)) return bad(StrCat("synset offset '", f[0], "' is not a number"));
  if (!absl::SimpleAtoi(f[1], &lexfile) || lexfile > 44) return bad(StrCat("lexicographer file '", f[1], "' is not 0..44"));
  if (f[2] != "n") return bad(StrCat("synset type '", f[2], "' is not a noun (n)"));
  if (!absl::SimpleHexAtoi(f[3], &words) || words == 0) return bad(StrCat("word count '", f[3], "' is not hex >= 1"));
  size_t i = 4;
  out->offset = offset;
  out->lexfile = static_cast<int>(lexfile);
  out->words.clear();
  out->hypernyms.clear();
  for (uint32_t w = 0; w < words; ++w, i += 2) {
    if (i + 1 >= f.size()) return bad(StrCat("the line ends inside its ", words, " words"));
    out->words.emplace_back(f[i]);
  }
  if (i >= f.size() || !absl::SimpleAtoi(f[i], &pointers)) return bad("no pointer count after the words");
  ++i;
  for (uint32_t p = 0; p < pointers; ++p, i += 4) {
    if (i + 3 >= f.size()) return bad(StrCat("the line ends inside its ", pointers, " pointers"));
    uint32_t target = 0;
    if (!absl::SimpleAtoi(f[i + 1], &target)) return bad(StrCat("pointer target '", f[i + 1], "' is not a number"));
    if ((f[i] == "@" || f[i] == "@i") && f[i + 2] == "n") out->hypernyms.push_back(target);
  }
  absl::string_view gloss = line.substr(bar + 3);
  while (!gloss.empty() && (gloss.back() == ' ' || gloss.back() == '\r')) gloss.remove_suffix(1);
  out->gloss = std::string(gloss);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<WordNetCorpus> WordNetCorpus::Load(const std::string& dir, int64_t vocab) {
  if (vocab < 16) return absl::InvalidArgumentError(StrCat("wordnet vocabulary: ", vocab, " words (want >= 16)"));
  const std::string path = dir + "/data.noun";
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(StrCat("WordNet: cannot read ", path,
                                      " (Debian's wordnet-base package installs it in ", kWordNetDefaultDir, ")"));
  }
  WordNetCorpus c;
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == ' ') continue;  // the license header
    WordNetSynset s;
    if (absl::Status st = ParseSynsetLine(line, StrCat(path, ":", lineno), &s); !st.ok()) return st;
    if (!c.index_.emplace(s.offset, c.synsets_.size()).second) {
      return absl::InvalidArgumentError(StrCat(path, ":", lineno, ": synset ", s.offset, " appears twice"));
    }
    c.synsets_.push_back(std::move(s));
  }
  if (c.synsets_.empty()) return absl::InvalidArgumentError(StrCat(path, ": no synsets"));
  absl::flat_hash_map<std::string, int64_t> freq;
  for (const WordNetSynset& s : c.synsets_) {
    for (std::string& w : GlossWords(s.gloss)) ++freq[std::move(w)];
  }
  std::vector<std::pair<int64_t, std::string>> ranked;
  ranked.reserve(freq.size());
  for (auto& [w, n] : freq) ranked.emplace_back(-n, w);
  std::sort(ranked.begin(), ranked.end());
  for (size_t k = 0; k < ranked.size() && static_cast<int64_t>(k) + 2 < vocab; ++k) {
    c.ids_.emplace(ranked[k].second, static_cast<int64_t>(k) + 2);
    c.words_.push_back(ranked[k].second);
  }
  return c;
}

const WordNetSynset* WordNetCorpus::Find(uint32_t offset) const {
  auto it = index_.find(offset);
  return it == index_.end() ? nullptr : &synsets_[it->second];
}

bool WordNetCorpus::IsA(uint32_t offset, uint32_t ancestor) const {
  std::vector<uint32_t> stack{offset};
  absl::flat_hash_map<uint32_t, bool> seen;
  while (!stack.empty()) {
    const uint32_t o = stack.back();
    stack.pop_back();
    if (o == ancestor) return true;
    if (!seen.emplace(o, true).second) continue;
    if (const WordNetSynset* s = Find(o); s != nullptr) stack.insert(stack.end(), s->hypernyms.begin(), s->hypernyms.end());
  }
  return false;
}

std::string_view WordNetCorpus::Word(int64_t id) const {
  if (id == kWordNetPad) return "<pad>";
  if (id < 2 || id - 2 >= static_cast<int64_t>(words_.size())) return "<unk>";
  return words_[static_cast<size_t>(id - 2)];
}

std::vector<int64_t> WordNetCorpus::Encode(std::string_view gloss) const {
  std::vector<int64_t> out;
  for (const std::string& w : GlossWords(gloss)) {
    auto it = ids_.find(w);
    out.push_back(it == ids_.end() ? kWordNetUnknown : it->second);
  }
  return out;
}

const std::vector<WordNetTask>& WordNetTasks() {
  static const auto* tasks = [] {
    auto* t = new std::vector<WordNetTask>;
    auto add = [&](std::string name, std::vector<std::string> a, std::vector<std::string> b, std::string what) {
      WordNetTask task;
      task.name = std::move(name);
      task.classes[0] = std::move(a);
      task.classes[1] = std::move(b);
      task.description = std::move(what);
      t->push_back(std::move(task));
    };
    // Pairs of lexicographer files: related when they share a file.
    const char* files[] = {"animal", "plant", "artifact", "food"};
    for (int i = 0; i < 4; ++i) {
      for (int j = i + 1; j < 4; ++j) {
        add(StrCat(files[i], "-", files[j]), {StrCat("lex:", files[i])}, {StrCat("lex:", files[j])},
            StrCat("is the gloss about ", files[i], " (0) or ", files[j], " (1)"));
      }
    }
    add("person-animal", {"lex:person"}, {"lex:animal"}, "a person (0) or an animal (1)");
    add("person-artifact", {"lex:person"}, {"lex:artifact"}, "a person (0) or an artifact (1)");
    add("location-artifact", {"lex:location"}, {"lex:artifact"}, "a location (0) or an artifact (1)");
    add("body-substance", {"lex:body"}, {"lex:substance"}, "a body part (0) or a substance (1)");
    add("act-communication", {"lex:act"}, {"lex:communication"}, "an act (0) or a communication (1)");
    // Crossing partitions of animal, plant, artifact, food: they conflict.
    add("living", {"lex:animal", "lex:plant"}, {"lex:artifact", "lex:food"}, "living (0) or not (1)");
    add("cross-ap", {"lex:animal", "lex:artifact"}, {"lex:plant", "lex:food"}, "animal or artifact (0), plant or food (1)");
    add("cross-af", {"lex:animal", "lex:food"}, {"lex:plant", "lex:artifact"}, "animal or food (0), plant or artifact (1)");
    // Sub-categories: nested inside the files above.
    add("mammal-bird", {"syn:mammal"}, {"syn:bird"}, "a mammal (0) or a bird (1)");
    add("mammal-reptile", {"syn:mammal"}, {"syn:reptile"}, "a mammal (0) or a reptile (1)");
    add("fish-insect", {"syn:fish"}, {"syn:insect"}, "a fish (0) or an insect (1)");
    add("tree-flower", {"syn:tree"}, {"syn:flower"}, "a tree (0) or a flower (1)");
    add("device-structure", {"syn:device"}, {"syn:structure"}, "a device (0) or a structure (1)");
    add("vehicle-weapon", {"syn:vehicle"}, {"syn:weapon"}, "a vehicle (0) or a weapon (1)");
    add("clothing-device", {"syn:clothing"}, {"syn:device"}, "clothing (0) or a device (1)");
    add("fruit-beverage", {"syn:fruit"}, {"syn:beverage"}, "an edible fruit (0) or a beverage (1)");
    return t;
  }();
  return *tasks;
}

absl::StatusOr<WordNetTask> FindWordNetTask(std::string_view name) {
  SLICESCHED_ASSIGN_OR_RETURN(TaskName parsed, ParseTaskName(name));
  for (const WordNetTask& t : WordNetTasks()) {
    if (t.name == parsed.base) return t;
  }
  std::vector<std::string> names;
  for (const WordNetTask& t : WordNetTasks()) names.push_back(t.name);
  return absl::NotFoundError(StrCat("unknown WordNet task '", name, "'; known: ", absl::StrJoin(names, ", ")));
}

namespace {

// Both classes' synsets in one pass over the corpus (a synset in both is in
// neither).
absl::StatusOr<std::array<std::vector<uint32_t>, 2>> ClassesOf(const WordNetCorpus& corpus, const WordNetTask& task) {
  // Per class: the lexicographer files and subtree roots it names.
  std::vector<int> lex[2];
  std::vector<uint32_t> roots[2];
  for (int c = 0; c < 2; ++c) {
    for (const std::string& cat : task.classes[c]) {
      bool known = false;
      if (cat.rfind("lex:", 0) == 0) {
        for (const auto& [name, num] : LexFiles()) {
          if (cat.substr(4) == name) lex[c].push_back(num), known = true;
        }
      } else if (cat.rfind("syn:", 0) == 0) {
        for (const auto& [name, off] : Subtrees()) {
          if (cat.substr(4) == name) roots[c].push_back(off), known = true;
        }
      }
      if (!known) return absl::InvalidArgumentError(StrCat("task ", task.name, ": unknown category '", cat, "'"));
    }
  }
  auto in_class = [&](const WordNetSynset& s, int c) {
    if (std::find(lex[c].begin(), lex[c].end(), s.lexfile) != lex[c].end()) return true;
    for (uint32_t r : roots[c]) {
      if (corpus.IsA(s.offset, r)) return true;
    }
    return false;
  };
  std::array<std::vector<uint32_t>, 2> out;
  for (const WordNetSynset& s : corpus.synsets()) {
    const bool in0 = in_class(s, 0), in1 = in_class(s, 1);
    if (in0 != in1) out[in0 ? 0 : 1].push_back(s.offset);
  }
  for (std::vector<uint32_t>& m : out) std::sort(m.begin(), m.end());
  return out;
}

}  // namespace

absl::StatusOr<std::vector<uint32_t>> WordNetClassMembers(const WordNetCorpus& corpus, const WordNetTask& task,
                                                          int cls) {
  if (cls != 0 && cls != 1) return absl::InvalidArgumentError(StrCat("class ", cls, " (a task has classes 0 and 1)"));
  SLICESCHED_ASSIGN_OR_RETURN(auto both, ClassesOf(corpus, task));
  return std::move(both[static_cast<size_t>(cls)]);
}

absl::StatusOr<std::vector<Example>> GenerateWordNet(const WordNetCorpus& corpus,
                                                     const WordNetDatasetOptions& options) {
  if (options.examples < 1) return absl::InvalidArgumentError(StrCat("examples: ", options.examples, " (want >= 1)"));
  if (options.sequence_length < 2) {
    return absl::InvalidArgumentError(StrCat("sequence_length: ", options.sequence_length, " (want >= 2)"));
  }
  SLICESCHED_ASSIGN_OR_RETURN(TaskName name, ParseTaskName(options.task));
  SLICESCHED_ASSIGN_OR_RETURN(WordNetTask task, FindWordNetTask(name.base));
  SLICESCHED_ASSIGN_OR_RETURN(auto members, ClassesOf(corpus, task));
  for (int c = 0; c < 2; ++c) {
    if (members[c].empty()) {
      return absl::FailedPreconditionError(StrCat("WordNet task ", task.name, ": class ", c, " (",
                                                  absl::StrJoin(task.classes[c], ", "), ") has no synset in this corpus"));
    }
  }
  uint64_t state = options.seed ^ (name.salt * 0x9E3779B97F4A7C15ull) ^ 0x5EED0F0A11ull;
  std::vector<Example> out;
  out.reserve(static_cast<size_t>(options.examples));
  for (int64_t k = 0; k < options.examples; ++k) {
    const int label = static_cast<int>(Mix(state) & 1);
    const std::vector<uint32_t>& m = members[label];
    const WordNetSynset* s = corpus.Find(m[Mix(state) % m.size()]);
    std::vector<int64_t> words = corpus.Encode(s->gloss);
    if (static_cast<int64_t>(words.size()) > options.sequence_length) {
      words.resize(static_cast<size_t>(options.sequence_length));
    }
    Example e;
    e.tokens.assign(static_cast<size_t>(options.sequence_length) - words.size(), kWordNetPad);
    e.tokens.insert(e.tokens.end(), words.begin(), words.end());
    e.label = label;
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace slicesched::synth
