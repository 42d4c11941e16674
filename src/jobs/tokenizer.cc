#include "slicesched/jobs/tokenizer.h"

#include <filesystem>
#include <utility>

#include "sentencepiece_backend.h"
#include "slicesched/common/strings.h"

namespace slicesched::jobs {

absl::StatusOr<std::shared_ptr<const Tokenizer>> Tokenizer::Load(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(StrCat("tokenizer ", path, ": no such file"));
  }
  std::string error;
  std::shared_ptr<const sentencepiece_backend::Model> m = sentencepiece_backend::Load(path, &error);
  if (m == nullptr) {
    return absl::InvalidArgumentError(StrCat("tokenizer ", path, ": not a SentencePiece model (", error, ")"));
  }
  const int64_t vocab = sentencepiece_backend::VocabSize(*m);
  return std::shared_ptr<const Tokenizer>(new Tokenizer(path, std::move(m), vocab));
}

absl::StatusOr<std::vector<int64_t>> Tokenizer::Encode(std::string_view text) const {
  std::vector<int> ids;
  std::string error;
  if (!sentencepiece_backend::Encode(*model_, text, &ids, &error)) {
    return absl::InvalidArgumentError(StrCat("tokenizer ", path_, ": cannot encode: ", error));
  }
  return std::vector<int64_t>(ids.begin(), ids.end());
}

absl::StatusOr<std::string> Tokenizer::Decode(const std::vector<int64_t>& ids) const {
  std::vector<int> narrow;
  narrow.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size_) {
      return absl::InvalidArgumentError(StrCat("tokenizer ", path_, ": token ", i, " is ", ids[i],
                                               ", outside its vocabulary of ", vocab_size_));
    }
    narrow.push_back(static_cast<int>(ids[i]));
  }
  std::string text, error;
  if (!sentencepiece_backend::Decode(*model_, narrow, &text, &error)) {
    return absl::InvalidArgumentError(StrCat("tokenizer ", path_, ": cannot decode: ", error));
  }
  return text;
}

absl::Status TrainTokenizer(const std::string& corpus, const std::string& model_prefix, int64_t vocab_size) {
  std::string error;
  // One thread and a fixed seed-free BPE: the same corpus gives the same model.
  const std::string args = StrCat("--input=", corpus, " --model_prefix=", model_prefix, " --vocab_size=", vocab_size,
                                  " --model_type=bpe --num_threads=1 --minloglevel=2");
  if (!sentencepiece_backend::Train(args, &error)) {
    return absl::InvalidArgumentError(StrCat("training a tokenizer on ", corpus, ": ", error));
  }
  return absl::OkStatus();
}

}  // namespace slicesched::jobs
