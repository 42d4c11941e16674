// A real task family from WordNet 3.0's noun glosses (Debian's
// wordnet-base, read at run time from /usr/share/wordnet; never copied into
// the repository).
//
// Corpus. Every noun synset of data.noun: its lexicographer file (noun.animal,
// noun.plant, ...), its words, its hypernyms (@ and @i pointers) and its
// gloss. A gloss is a definition written by lexicographers ("a member of the
// genus Canis that has been domesticated by man ..."), so what a gloss is
// about is a property of real text, not of a generator.
//
// Tasks. Each task classifies glosses into 2 classes; a class is a set of
// categories, a category either a lexicographer file (lex:animal) or every
// synset under a hypernym (syn:mammal, by a fixed synset offset). A synset
// that falls in both classes is left out of the task. Relatedness follows
// the hierarchy (WordNetTasks() lists the family; its header comment names
// the level of each pair):
//   identical    NAME and NAME@K: the same rule, other synsets drawn;
//   related      two tasks that share a class (animal-plant, animal-artifact)
//                or whose classes nest (animal-plant, mammal-bird);
//   unrelated    tasks over disjoint categories (animal-plant,
//                artifact-food);
//   conflicting  crossing partitions of the same four categories: living
//                ({animal, plant} | {artifact, food}) against cross-ap
//                ({animal, artifact} | {plant, food}) and cross-af: what one
//                task's adapter merges, the other has to tell apart.
//
// Examples. The label is drawn first (balanced classes), then a synset of
// that class, uniformly; its gloss, lowercased and cut at every character
// that is not a letter or digit, becomes word tokens, truncated to
// sequence_length and left-padded with kWordNetPad, so that the last
// position (where the training code puts the label) is the gloss's last
// word. The vocabulary is the corpus's most frequent gloss words (ties by
// spelling), ids from 2; kWordNetUnknown for the rest. Deterministic: the
// same corpus and options give the same examples on every platform.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "slicesched/synth/tasks.h"

namespace slicesched::synth {

inline constexpr char kWordNetDefaultDir[] = "/usr/share/wordnet";
inline constexpr int64_t kWordNetPad = 0;
inline constexpr int64_t kWordNetUnknown = 1;

struct WordNetSynset {
  uint32_t offset = 0;
  int lexfile = 0;  // lexicographer file number (lexnames(5WN)): 5 noun.animal, ...
  std::vector<std::string> words;
  std::vector<uint32_t> hypernyms;
  std::string gloss;
};

class WordNetCorpus {
 public:
  // Reads DIR/data.noun. NotFound naming the path (and the package that
  // ships it) when it is absent; InvalidArgument "PATH:LINE: what is wrong"
  // for a malformed synset line. `vocab` words make the vocabulary (>= 16).
  static absl::StatusOr<WordNetCorpus> Load(const std::string& dir = kWordNetDefaultDir, int64_t vocab = 4096);

  const std::vector<WordNetSynset>& synsets() const { return synsets_; }
  const WordNetSynset* Find(uint32_t offset) const;
  // True when `ancestor` is `offset` or one of its hypernyms, transitively.
  bool IsA(uint32_t offset, uint32_t ancestor) const;
  int64_t vocab_size() const { return static_cast<int64_t>(words_.size()) + 2; }
  // The word of a token id ("<pad>", "<unk>" for the two reserved ids).
  std::string_view Word(int64_t id) const;
  // The gloss's word tokens (no padding, no truncation).
  std::vector<int64_t> Encode(std::string_view gloss) const;

 private:
  std::vector<WordNetSynset> synsets_;
  absl::flat_hash_map<uint32_t, size_t> index_;  // offset -> synsets_ index
  std::vector<std::string> words_;                // id - 2 -> word
  absl::flat_hash_map<std::string, int64_t> ids_;
};

// A category: a lexicographer file ("lex:animal") or a hypernym subtree
// ("syn:NAME", the names WordNetTasks() uses, fixed synset offsets).
struct WordNetTask {
  std::string name;
  std::vector<std::string> classes[2];  // categories of class 0 and class 1
  std::string description;
};

// The family, in a fixed order (at least 16 tasks).
const std::vector<WordNetTask>& WordNetTasks();
// NotFound naming `name` and listing the family's names (NAME@K accepted).
absl::StatusOr<WordNetTask> FindWordNetTask(std::string_view name);

struct WordNetDatasetOptions {
  std::string task;
  uint64_t seed = 0;
  int64_t examples = 1024;
  int64_t sequence_length = 32;
};

// The task's examples. InvalidArgument for an unknown task or bad sizes;
// FailedPrecondition when a class has no synset in this corpus.
absl::StatusOr<std::vector<Example>> GenerateWordNet(const WordNetCorpus& corpus,
                                                     const WordNetDatasetOptions& options);

// The synsets of each class of `task` in this corpus (offsets, ascending;
// those in both classes left out).
absl::StatusOr<std::vector<uint32_t>> WordNetClassMembers(const WordNetCorpus& corpus, const WordNetTask& task,
                                                          int cls);

}  // namespace slicesched::synth
