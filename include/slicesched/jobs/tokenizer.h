// A deployment's text tokenizer: a SentencePiece model file (Debian's
// libsentencepiece), so batch requests may give their prompt and stop
// strings as text and get their answers decoded beside the token ids.
//
// Errors name the model file. Thread safety: a loaded Tokenizer is
// immutable and may be used from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace slicesched::jobs {

namespace sentencepiece_backend {
struct Model;
}

class Tokenizer {
 public:
  // NotFound / InvalidArgument naming `path` when it is not a model file.
  static absl::StatusOr<std::shared_ptr<const Tokenizer>> Load(const std::string& path);

  const std::string& path() const { return path_; }
  int64_t vocab_size() const { return vocab_size_; }
  absl::StatusOr<std::vector<int64_t>> Encode(std::string_view text) const;
  // Ids outside [0, vocab_size) are an InvalidArgument naming the first.
  absl::StatusOr<std::string> Decode(const std::vector<int64_t>& ids) const;

 private:
  Tokenizer(std::string path, std::shared_ptr<const sentencepiece_backend::Model> model, int64_t vocab_size)
      : path_(std::move(path)), model_(std::move(model)), vocab_size_(vocab_size) {}
  std::string path_;
  std::shared_ptr<const sentencepiece_backend::Model> model_;
  int64_t vocab_size_;
};

// Trains a SentencePiece model with the library's own trainer (BPE) on the
// text file `corpus`, writing MODEL_PREFIX.model and .vocab.
absl::Status TrainTokenizer(const std::string& corpus, const std::string& model_prefix, int64_t vocab_size);

}  // namespace slicesched::jobs
