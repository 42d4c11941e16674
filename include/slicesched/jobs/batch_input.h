// Offline batch inference: the input file of a batch job, in OpenAI's Batch
// API input format (JSONL, one request per line):
//
//   {"custom_id": "req-1", "method": "POST", "url": "/v1/completions",
//    "body": {"model": "chat", "prompt": [1, 2, 3], "max_tokens": 16,
//             "temperature": 0, "top_p": 1, "seed": 7, "stop": [2]}}
//
// `model` names a deployment. `prompt` is token ids, or text when the
// deployment has a tokenizer; `stop` likewise (one or a list). Blank lines
// are skipped. Every problem is reported with its 1-based line number: bad
// JSON, a missing or repeated custom_id, an unknown field, an unknown model,
// a prompt whose KV cache (prompt + max_tokens) no device can hold, values
// out of range. With `strict` the whole file is refused when any line is bad;
// otherwise the good lines are accepted and the bad ones listed.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace slicesched {

struct BatchRequest {
  int64_t line = 0;  // 1-based, in the input file
  std::string custom_id;
  std::string model;
  std::vector<int64_t> prompt_tokens;  // when given as token ids
  std::optional<std::string> prompt_text;  // when given as text (tokenized later)
  int64_t max_tokens = 16;  // OpenAI's default
  double temperature = 1.0;
  double top_p = 1.0;
  std::optional<uint64_t> seed;
  std::vector<int64_t> stop_tokens;
  std::vector<std::string> stop_text;
};

struct BatchLineError {
  int64_t line = 0;
  std::string custom_id;  // when the line got that far
  std::string message;    // "line 7: ..."
};

// What the parser needs to know of a deployment.
struct BatchModelInfo {
  int64_t vocab = 0;
  int64_t max_context_tokens = 0;  // prompt + generated tokens one request's KV cache may hold
  bool has_tokenizer = false;
  // With a tokenizer: text -> token ids. Text prompts are then encoded at
  // submit (prompt_tokens filled, prompt_text kept) and checked like ids; a
  // stop string of one token becomes a stop token, longer ones stay text.
  std::function<absl::StatusOr<std::vector<int64_t>>(std::string_view)> encode;
};
using BatchModelLookup = std::function<std::optional<BatchModelInfo>(std::string_view model)>;

struct BatchInput {
  std::vector<BatchRequest> requests;
  std::vector<BatchLineError> errors;  // lines left out (never with strict)
};

// The most errors one refusal or report lists in its message.
inline constexpr size_t kMaxBatchErrorsListed = 20;

// Parses a batch input file. Fails with InvalidArgument when the file holds
// no valid request, or, with `strict`, when any line is bad; the message
// lists the bad lines (up to kMaxBatchErrorsListed, then a count).
// With `deployment`, a line without body.model runs on it and a line that
// names another model is bad.
absl::StatusOr<BatchInput> ParseBatchInput(std::string_view jsonl, const BatchModelLookup& models, bool strict,
                                           std::string_view deployment = {});

// A validated request as stored with its batch (compact JSON holding every
// field but `line`), and back. Decode fails with DataLoss naming the field
// when the text is not what Encode writes.
std::string EncodeBatchRequest(const BatchRequest& r);
absl::StatusOr<BatchRequest> DecodeBatchRequest(std::string_view json);

// The sampling seed of a request: its own `seed` when given and non-zero,
// else one derived from its custom_id, so a request re-run after a restart
// samples the same tokens.
uint64_t BatchRequestSeed(const BatchRequest& r);

// The report of `errors`: one line each, up to kMaxBatchErrorsListed.
std::string DescribeBatchErrors(const std::vector<BatchLineError>& errors);

}  // namespace slicesched
