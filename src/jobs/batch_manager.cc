#include "slicesched/jobs/batch_manager.h"

#include <algorithm>
#include <charconv>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "json_writer.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

namespace slicesched::jobs {
namespace {

std::string IdOf(uint64_t batch, int64_t index) { return StrCat("batch_req_", batch, "_", index); }

}  // namespace

bool IsTerminalBatchState(std::string_view state) {
  return state == kBatchCompleted || state == kBatchExpired || state == kBatchCancelled || state == kBatchFailed;
}

absl::StatusOr<int64_t> ParseCompletionWindow(std::string_view text) {
  if (text.empty()) return 0;
  auto bad = [&] {
    return absl::InvalidArgumentError(StrCat("completion_window '", text,
                                             "': give a count and a unit, s, m, h or d (e.g. \"24h\"), "
                                             "between 1s and 30d"));
  };
  const char unit = text.back();
  const std::string_view digits = text.substr(0, text.size() - 1);
  int64_t n = 0;
  const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (digits.empty() || r.ec != std::errc() || r.ptr != digits.data() + digits.size() || n <= 0) return bad();
  int64_t scale = 0;
  switch (unit) {
    case 's': scale = 1; break;
    case 'm': scale = 60; break;
    case 'h': scale = 3600; break;
    case 'd': scale = 86400; break;
    default: return bad();
  }
  constexpr int64_t kMax = 30 * 86400;
  if (n > kMax / scale) return bad();
  return n * scale;
}

std::string CompletionBody(const BatchRequest& request, const CompletionResult& result) {
  std::string ids = "[";
  for (size_t i = 0; i < result.tokens.size(); ++i) ids += StrCat(i > 0 ? "," : "", result.tokens[i]);
  ids += "]";
  const std::string choice = JsonObject()
                                 .Add("index", 0)
                                 .Add("text", result.text)
                                 .AddRaw("token_ids", ids)
                                 .Add("finish_reason", result.finish_reason)
                                 .str();
  const int64_t prompt = static_cast<int64_t>(request.prompt_tokens.size());
  const int64_t completion = static_cast<int64_t>(result.tokens.size());
  const std::string usage = JsonObject()
                                .Add("prompt_tokens", prompt)
                                .Add("completion_tokens", completion)
                                .Add("total_tokens", prompt + completion)
                                .str();
  return JsonObject()
      .Add("id", result.request_id)
      .Add("object", "text_completion")
      .Add("created", result.created_unix_s)
      .Add("model", request.model)
      .AddRaw("choices", StrCat("[", choice, "]"))
      .AddRaw("usage", usage)
      .str();
}

std::string BatchErrorBody(std::string_view code, std::string_view message) {
  return JsonObject().Add("code", code).Add("message", message).str();
}

BatchProgress ProgressOf(const StoredBatch& b, int64_t now_unix_ms) {
  BatchProgress p;
  p.done = b.succeeded + b.failed;
  p.total = b.total;
  const int64_t end = b.finished_unix_ms > 0 ? b.finished_unix_ms : now_unix_ms;
  const double elapsed_s = std::max<int64_t>(end - b.created_unix_ms, 1) / 1000.0;
  p.tokens_per_second = static_cast<double>(b.completion_tokens) / elapsed_s;
  if (!IsTerminalBatchState(b.state) && p.done > 0) {
    // Requests per second so far, applied to the requests left.
    p.eta_s = static_cast<double>(p.total - p.done) * elapsed_s / static_cast<double>(p.done);
  }
  return p;
}

BatchManager::BatchManager(std::unique_ptr<StateStore> store, Options options)
    : store_(std::move(store)), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<BatchManager>> BatchManager::Open(const std::string& state_dir, Options options) {
  if (!options.models) return absl::InvalidArgumentError("batch manager: no deployment lookup");
  StateStore::Options so;
  so.now_unix_ms = options.now_unix_ms;
  SLICESCHED_ASSIGN_OR_RETURN(std::unique_ptr<StateStore> store, StateStore::Open(state_dir, std::move(so)));
  return std::unique_ptr<BatchManager>(new BatchManager(std::move(store), std::move(options)));
}

int64_t BatchManager::Now() const {
  return options_.now_unix_ms ? options_.now_unix_ms() : absl::ToUnixMillis(absl::Now());
}

absl::StatusOr<BatchSubmitResult> BatchManager::Submit(const BatchSubmit& submit) {
  SLICESCHED_ASSIGN_OR_RETURN(const int64_t window_s, ParseCompletionWindow(submit.completion_window));
  if (!submit.deployment.empty() && !options_.models(submit.deployment).has_value()) {
    return absl::NotFoundError(StrCat("deployment: no deployment named '", submit.deployment, "'"));
  }
  SLICESCHED_ASSIGN_OR_RETURN(BatchInput input,
                              ParseBatchInput(submit.jsonl, options_.models, submit.strict, submit.deployment));
  if (static_cast<int64_t>(input.requests.size()) > options_.max_requests) {
    return absl::InvalidArgumentError(StrCat("the batch holds ", input.requests.size(),
                                             " requests; one batch may hold at most ", options_.max_requests,
                                             ": split the file"));
  }
  BatchSubmitResult out;
  out.accepted = static_cast<int64_t>(input.requests.size());
  out.rejected = std::move(input.errors);
  if (submit.validate_only) return out;

  std::vector<StoredBatchRequest> rows;
  rows.reserve(input.requests.size());
  for (size_t i = 0; i < input.requests.size(); ++i) {
    const BatchRequest& r = input.requests[i];
    rows.push_back(StoredBatchRequest{static_cast<int64_t>(i), r.line, r.custom_id, EncodeBatchRequest(r)});
  }
  StoredBatch b;
  b.state = std::string(kBatchInProgress);
  b.deployment = submit.deployment;
  b.tenant = submit.tenant.empty() ? "default" : submit.tenant;
  b.rejected = static_cast<int64_t>(out.rejected.size());
  b.completion_window_s = window_s;
  b.deadline_unix_ms = window_s > 0 ? Now() + window_s * 1000 : 0;
  b.metadata_json = submit.metadata_json.empty() ? "{}" : submit.metadata_json;
  if (!out.rejected.empty()) {
    b.message = StrCat(out.rejected.size(), " line(s) left out:\n", DescribeBatchErrors(out.rejected));
  }
  SLICESCHED_ASSIGN_OR_RETURN(out.batch_id, store_->CreateBatch(b, rows));
  return out;
}

absl::StatusOr<StoredBatch> BatchManager::Get(uint64_t id) { return store_->GetBatch(id); }

absl::StatusOr<std::vector<StoredBatch>> BatchManager::List(const BatchFilter& filter) {
  return store_->ListBatches(filter);
}

absl::StatusOr<StoredBatch> BatchManager::Cancel(uint64_t id, std::string_view reason) {
  absl::MutexLock lock(&transition_mu_);
  SLICESCHED_ASSIGN_OR_RETURN(StoredBatch b, store_->GetBatch(id));
  if (IsTerminalBatchState(b.state)) return b;
  return store_->UpdateBatch(
      id, BatchUpdate{.state = std::string(kBatchCancelled), .message = std::string(reason), .finished_unix_ms = Now()});
}

absl::StatusOr<std::vector<StoredBatch>> BatchManager::Active() {
  SLICESCHED_ASSIGN_OR_RETURN(std::vector<StoredBatch> active,
                              store_->ListBatches(BatchFilter{.states = {std::string(kBatchInProgress)}}));
  std::stable_sort(active.begin(), active.end(), [](const StoredBatch& a, const StoredBatch& b) {
    const int64_t da = a.deadline_unix_ms > 0 ? a.deadline_unix_ms : INT64_MAX;
    const int64_t db = b.deadline_unix_ms > 0 ? b.deadline_unix_ms : INT64_MAX;
    return da < db;
  });
  return active;
}

absl::StatusOr<std::vector<StoredBatchRequest>> BatchManager::Pending(uint64_t id, int64_t after_index,
                                                                      int64_t limit) {
  return store_->PendingBatchRequests(id, after_index, limit);
}

absl::Status BatchManager::Record(uint64_t id, const StoredBatchResult& result) {
  absl::MutexLock lock(&transition_mu_);
  SLICESCHED_ASSIGN_OR_RETURN(StoredBatch b, store_->GetBatch(id));
  if (b.state != kBatchInProgress) {
    return absl::FailedPreconditionError(
        StrCat("batch ", id, " is ", b.state, ": the result of request ", result.index, " is dropped"));
  }
  return store_->PutBatchResult(id, result);
}

absl::StatusOr<StoredBatch> BatchManager::Finish(uint64_t id, std::string_view state, std::string_view message) {
  if (!IsTerminalBatchState(state) || state == kBatchCancelled) {
    return absl::InvalidArgumentError(StrCat("batch ", id, ": cannot finish as '", state, "'"));
  }
  absl::MutexLock lock(&transition_mu_);
  SLICESCHED_ASSIGN_OR_RETURN(StoredBatch b, store_->GetBatch(id));
  if (b.state != kBatchInProgress) {
    return absl::FailedPreconditionError(StrCat("batch ", id, ": cannot go from ", b.state, " to ", state));
  }
  return store_->UpdateBatch(
      id, BatchUpdate{.state = std::string(state), .message = std::string(message), .finished_unix_ms = Now()});
}

absl::StatusOr<std::vector<std::string>> BatchManager::ResultLines(uint64_t id, int64_t after_index, int64_t limit,
                                                                   int64_t* next_index, bool* more) {
  SLICESCHED_ASSIGN_OR_RETURN(StoredBatch b, store_->GetBatch(id));
  SLICESCHED_ASSIGN_OR_RETURN(std::vector<BatchResultRow> rows, store_->ListBatchResults(id, after_index, limit));
  *next_index = rows.empty() ? after_index : rows.back().index;
  *more = static_cast<int64_t>(rows.size()) == limit && *next_index + 1 < b.total;
  std::string unfinished_code;
  if (b.state == kBatchCancelled) unfinished_code = "batch_cancelled";
  if (b.state == kBatchExpired) unfinished_code = "batch_expired";
  if (b.state == kBatchFailed) unfinished_code = "batch_failed";
  std::vector<std::string> lines;
  lines.reserve(rows.size());
  for (const BatchResultRow& r : rows) {
    JsonObject line;
    line.Add("id", IdOf(id, r.index)).Add("custom_id", r.custom_id);
    if (r.result.has_value() && r.result->ok) {
      line.AddRaw("response", JsonObject()
                                  .Add("status_code", 200)
                                  .Add("request_id", IdOf(id, r.index))
                                  .AddRaw("body", r.result->body_json)
                                  .str())
          .AddRaw("error", "null");
    } else if (r.result.has_value()) {
      line.AddRaw("response", "null").AddRaw("error", r.result->body_json);
    } else if (!unfinished_code.empty()) {
      line.AddRaw("response", "null")
          .AddRaw("error", BatchErrorBody(unfinished_code, StrCat("the batch is ", b.state, " (", b.message,
                                                                  ") before this request ran")));
    } else {
      continue;  // still to run
    }
    lines.push_back(line.str() + "\n");
  }
  return lines;
}

}  // namespace slicesched::jobs
