// The durable lifecycle of offline batch inference jobs.
//
// A batch is a file of requests in OpenAI's Batch input format
// (jobs/batch_input.h). Submit validates it line by line and stores the
// batch and every accepted request in one transaction (nothing of a refused
// or failed submit remains). The batch runner (server/batch_runner.h) then
// runs its requests as offline Generate requests and records each result
// here; a request is done exactly when its result is stored
// (StateStore::PutBatchResult), so after a crash the requests without a
// result run again and none runs twice into the output.
//
// States (OpenAI's names):
//   Submit                          -> in_progress
//   the last result stored          in_progress -> completed   (terminal)
//   the completion window passed    in_progress -> expired     (terminal)
//   Cancel                          in_progress -> cancelled   (terminal; on a
//                                   terminal batch: no change, no error)
//   the deployment is gone, or a    in_progress -> failed      (terminal)
//   stored request cannot be read
// Finished results are kept in every terminal state. Results are recorded
// only while the batch is in_progress (a result that arrives after a cancel
// or the expiry is dropped: the request counts as not done).
//
// Output (ResultLines): one line per request, in input order, in OpenAI's
// Batch output format:
//   {"id": "batch_req_<batch>_<index>", "custom_id": ..., "response":
//    {"status_code": 200, "request_id": ..., "body": <completion>}, "error": null}
//   {"id": ..., "custom_id": ..., "response": null, "error": {"code", "message"}}
// A request without a result is listed only once the batch is terminal,
// with error code "batch_cancelled", "batch_expired" or "batch_failed", so
// the output of a finished batch holds every custom_id exactly once.
//
// Completion window: "24h", "90m", "3600s", "2d" (1 s .. 30 days) or empty
// (none); it becomes the batch's deadline, submit time + window.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "slicesched/jobs/batch_input.h"
#include "slicesched/server/state_store.h"

namespace slicesched::jobs {

inline constexpr std::string_view kBatchInProgress = "in_progress";
inline constexpr std::string_view kBatchCompleted = "completed";
inline constexpr std::string_view kBatchExpired = "expired";
inline constexpr std::string_view kBatchCancelled = "cancelled";
inline constexpr std::string_view kBatchFailed = "failed";

bool IsTerminalBatchState(std::string_view state);

// "24h", "90m", "3600s", "2d" -> seconds; "" -> 0 (no window).
// InvalidArgument naming completion_window otherwise.
absl::StatusOr<int64_t> ParseCompletionWindow(std::string_view text);

struct BatchSubmit {
  std::string jsonl;       // the input file
  std::string deployment;  // "" = every line names its model
  bool strict = false;     // refuse the whole file on any bad line
  std::string completion_window;
  std::string tenant = "default";
  std::string metadata_json = "{}";
  bool validate_only = false;
};

struct BatchSubmitResult {
  uint64_t batch_id = 0;  // 0 when validate_only
  int64_t accepted = 0;
  std::vector<BatchLineError> rejected;  // lines left out (never with strict)
};

// The response body of a finished request: an OpenAI text_completion with
// the generated token ids (and text, when the deployment decoded them).
struct CompletionResult {
  std::vector<int64_t> tokens;
  std::string finish_reason;  // "length" or "stop"
  std::string text;           // "" when there is no tokenizer
  std::string request_id;
  int64_t created_unix_s = 0;
};
std::string CompletionBody(const BatchRequest& request, const CompletionResult& result);
std::string BatchErrorBody(std::string_view code, std::string_view message);

// A batch's progress as users see it.
struct BatchProgress {
  int64_t done = 0;  // succeeded + failed
  int64_t total = 0;
  // Completed tokens per second since submit, and the time left at that
  // rate (seconds; -1 when nothing is done yet or the batch is terminal).
  double tokens_per_second = 0;
  double eta_s = -1;
};
BatchProgress ProgressOf(const StoredBatch& b, int64_t now_unix_ms);

class BatchManager {
 public:
  struct Options {
    // What the parser needs of each deployment (required).
    BatchModelLookup models;
    // Wall clock of the stored times and deadlines (tests inject one).
    std::function<int64_t()> now_unix_ms;
    // Largest accepted request count of one batch.
    int64_t max_requests = 1'000'000;
  };

  // Opens STATE_DIR/sliced.db (shared with the daemon's other connections).
  static absl::StatusOr<std::unique_ptr<BatchManager>> Open(const std::string& state_dir, Options options);

  // Validates (InvalidArgument listing the bad lines by number; see
  // ParseBatchInput) and stores the batch with its accepted requests.
  absl::StatusOr<BatchSubmitResult> Submit(const BatchSubmit& submit);
  absl::StatusOr<StoredBatch> Get(uint64_t id);  // NotFound
  absl::StatusOr<std::vector<StoredBatch>> List(const BatchFilter& filter = {});
  absl::StatusOr<StoredBatch> Cancel(uint64_t id, std::string_view reason = "cancelled by the user");

  // --- The runner's side -----------------------------------------------------
  // in_progress batches, earliest deadline first (no deadline last), then id.
  absl::StatusOr<std::vector<StoredBatch>> Active();
  absl::StatusOr<std::vector<StoredBatchRequest>> Pending(uint64_t id, int64_t after_index, int64_t limit);
  // Stores the result of a request of an in_progress batch. FailedPrecondition
  // (nothing stored) when the batch is no longer in_progress; AlreadyExists
  // when the request has a result.
  absl::Status Record(uint64_t id, const StoredBatchResult& result);
  // in_progress -> `state` (completed, expired, failed) with `message`;
  // FailedPrecondition from any other state.
  absl::StatusOr<StoredBatch> Finish(uint64_t id, std::string_view state, std::string_view message);

  // --- Output ------------------------------------------------------------------
  // Output lines (each ending in '\n') of the requests with index >
  // after_index, at most `limit` requests looked at; `*next_index` is the
  // last index looked at (pass it back as after_index), `*more` whether
  // requests follow it.
  absl::StatusOr<std::vector<std::string>> ResultLines(uint64_t id, int64_t after_index, int64_t limit,
                                                       int64_t* next_index, bool* more);

  int64_t Now() const;
  StateStore* store() { return store_.get(); }

 private:
  BatchManager(std::unique_ptr<StateStore> store, Options options);
  std::unique_ptr<StateStore> store_;
  Options options_;
  // Record, Cancel and Finish read a batch's state and then write: the lock
  // keeps a result from landing after the cancel that ends its batch.
  absl::Mutex transition_mu_;
};

}  // namespace slicesched::jobs
